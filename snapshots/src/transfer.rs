//! The data object's writer: one PUT while the archive fits in a part, a multipart upload
//! (parts uploaded concurrently, at most `max_concurrency` in flight) once it outgrows one.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};

/// Writes one data object from chunks as they come.
pub(crate) enum DataWriter {
    /// Fewer than a part's bytes so far, held until the end or until they fill a part.
    Buffering {
        store: Arc<dyn ObjectStore>,
        path: ObjectPath,
        part_size: usize,
        chunks: Vec<Bytes>,
        len: usize,
    },
    /// A multipart upload under way.
    Multipart(WriteMultipart),
}

impl DataWriter {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, path: ObjectPath, part_size: usize) -> Self {
        DataWriter::Buffering {
            store,
            path,
            part_size,
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Adds `chunk`, waiting while `max_concurrency` parts are in flight.
    pub(crate) async fn put(
        &mut self,
        chunk: Bytes,
        max_concurrency: usize,
    ) -> object_store::Result<()> {
        match self {
            DataWriter::Buffering {
                store,
                path,
                part_size,
                chunks,
                len,
            } => {
                *len += chunk.len();
                chunks.push(chunk);
                if *len >= *part_size {
                    let upload = store.put_multipart(path).await?;
                    let mut multipart = WriteMultipart::new_with_chunk_size(upload, *part_size);
                    for chunk in chunks.drain(..) {
                        multipart.put(chunk);
                    }
                    *self = DataWriter::Multipart(multipart);
                }
                Ok(())
            }
            DataWriter::Multipart(multipart) => {
                multipart.wait_for_capacity(max_concurrency).await?;
                multipart.put(chunk);
                Ok(())
            }
        }
    }

    /// Completes the object (a failed multipart completion aborts the upload).
    pub(crate) async fn finish(self) -> object_store::Result<()> {
        match self {
            DataWriter::Buffering {
                store,
                path,
                chunks,
                ..
            } => {
                let payload: PutPayload = chunks.into_iter().collect();
                store.put(&path, payload).await.map(drop)
            }
            DataWriter::Multipart(multipart) => multipart.finish().await.map(drop),
        }
    }

    /// Gives up: a multipart upload is aborted (its parts removed); a buffered one never
    /// reached the store.
    pub(crate) async fn abort(self) {
        if let DataWriter::Multipart(multipart) = self {
            // Best effort: an upload the store keeps is cleaned by its own lifecycle rules.
            let _ = multipart.abort().await;
        }
    }
}
