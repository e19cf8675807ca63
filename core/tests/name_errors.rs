//! A rejected name is echoed in its error, cut to at most 200 bytes on a character boundary, so
//! an error message stays readable whatever was passed in.

use sandkeeper::*;

#[test]
fn a_short_rejected_name_is_shown_whole() {
    let e = SessionId::new("bad name").unwrap_err();
    assert_eq!(e.name, "bad name");
}

#[test]
fn a_long_rejected_name_is_shown_cut_to_200_bytes() {
    let long = "a".repeat(250);
    let e = SessionId::new(&long).unwrap_err();
    assert_eq!(e.name, "a".repeat(200));
    // Exactly 200 bytes: shown whole (still too long to be a name).
    let e = SessionId::new("b".repeat(200)).unwrap_err();
    assert_eq!(e.name.len(), 200);
}

#[test]
fn the_cut_never_splits_a_character() {
    // 199 ASCII bytes, then a two-byte character across the 200-byte mark.
    let name = format!("{}é{}", "a".repeat(199), "b".repeat(100));
    let e = CallId::new(&name).unwrap_err();
    assert_eq!(e.name, "a".repeat(199));
}
