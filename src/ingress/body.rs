//! Reading a callback body with a size limit that never turns into an error answer.

use actix_web::error::PayloadError;
use actix_web::web;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

/// A callback body as read.
pub(super) enum Body {
    /// The whole body, within the limit.
    Complete(Bytes),
    /// Over the limit: the bytes were drained and discarded, only the size is known.
    TooLarge { size: u64 },
}

/// Reads the whole request body. Past `limit` bytes it keeps reading (so that the
/// client can read our 200) but keeps nothing.
pub(super) async fn read(
    mut payload: web::Payload,
    limit: u64,
    size_hint: Option<u64>,
) -> Result<Body, PayloadError> {
    let mut size: u64 = 0;
    let mut kept = BytesMut::new();
    let mut too_large = size_hint.is_some_and(|n| n > limit);
    if !too_large {
        let reserve = size_hint.unwrap_or(0).min(limit);
        kept.reserve(usize::try_from(reserve).unwrap_or(0));
    }
    while let Some(chunk) = payload.next().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if too_large {
            continue;
        }
        if size > limit {
            too_large = true;
            kept = BytesMut::new();
        } else {
            kept.extend_from_slice(&chunk);
        }
    }
    Ok(if too_large { Body::TooLarge { size } } else { Body::Complete(kept.freeze()) })
}
