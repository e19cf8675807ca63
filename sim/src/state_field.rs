//! Reads one top-level field of a serialisable struct (the core's state) as JSON, without
//! serialising the other fields: the liveness phase's `liveness-keys-forgotten` check needs the
//! core's key records only, and serialising the whole core per seed was a tenth of a run's cost.

use serde::ser::{self, Impossible, Serialize, SerializeStruct, Serializer};

/// Why a field could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    /// The value is not a struct.
    #[error("the value does not serialise as a struct")]
    NotAStruct,
    /// The field's value did not serialise.
    #[error("{0}")]
    Json(String),
}

impl ser::Error for FieldError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        FieldError::Json(msg.to_string())
    }
}

/// The field `name` of `value` (a struct) as JSON; `Ok(None)` when the struct has no such field.
pub fn field<T: Serialize>(
    value: &T,
    name: &'static str,
) -> Result<Option<serde_json::Value>, FieldError> {
    value.serialize(FieldReader { name })
}

/// A serializer that accepts one struct and keeps one of its fields.
struct FieldReader {
    name: &'static str,
}

/// The struct being read.
struct Fields {
    name: &'static str,
    found: Option<serde_json::Value>,
}

impl SerializeStruct for Fields {
    type Ok = Option<serde_json::Value>;
    type Error = FieldError;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), FieldError> {
        if key == self.name {
            let v = serde_json::to_value(value).map_err(|e| FieldError::Json(e.to_string()))?;
            self.found = Some(v);
        }
        Ok(())
    }

    fn end(self) -> Result<Self::Ok, FieldError> {
        Ok(self.found)
    }
}

type No = Impossible<Option<serde_json::Value>, FieldError>;

macro_rules! not_a_struct {
    ($($method:ident($($arg:ty),*);)*) => {
        $(
            fn $method(self, $(_: $arg),*) -> Result<Self::Ok, FieldError> {
                Err(FieldError::NotAStruct)
            }
        )*
    };
}

impl Serializer for FieldReader {
    type Ok = Option<serde_json::Value>;
    type Error = FieldError;
    type SerializeSeq = No;
    type SerializeTuple = No;
    type SerializeTupleStruct = No;
    type SerializeTupleVariant = No;
    type SerializeMap = No;
    type SerializeStruct = Fields;
    type SerializeStructVariant = No;

    not_a_struct! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_none();
        serialize_unit();
        serialize_unit_struct(&'static str);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<Self::Ok, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Self::Ok, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_tuple(self, _: usize) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_map(self, _: Option<usize>) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Fields, FieldError> {
        Ok(Fields {
            name: self.name,
            found: None,
        })
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<No, FieldError> {
        Err(FieldError::NotAStruct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    struct Two {
        a: u32,
        keys: Vec<&'static str>,
    }

    #[test]
    fn reads_one_field_and_only_structs() {
        let two = Two {
            a: 7,
            keys: vec!["k"],
        };
        assert_eq!(
            field(&two, "keys").expect("a struct"),
            Some(serde_json::json!(["k"]))
        );
        assert_eq!(field(&two, "nope").expect("a struct"), None);
        assert!(matches!(field(&3u32, "keys"), Err(FieldError::NotAStruct)));
    }
}
