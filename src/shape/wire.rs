//! What the relay and a shaping process say to each other over their socket.
//!
//! A frame is a JSON head and a byte payload, each behind its length (u32, little
//! endian). The relay sends a [`Job`] with the event's body as payload; the process
//! answers an [`Answer`], with the transformed body as payload. JSON for the head
//! because it is small and readable in a trace; the body travels as raw bytes, never
//! re-encoded.

use serde::{Deserialize, Serialize};

/// The largest head either side reads: a job's metadata or an answer's reason.
pub(crate) const MAX_HEAD: usize = 1 << 20;
/// The largest payload either side reads: a body (ingress allows at most 64 MiB) or a
/// transform's output (larger is refused by the shaping process, with a reason).
pub(crate) const MAX_PAYLOAD: usize = 64 << 20;

/// Which rule reads a program's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Role {
    Filter,
    Transform,
}

impl Role {
    /// As a metric label and in messages.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Transform => "transform",
        }
    }
}

/// One program to run on one event (the body is the frame's payload).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    pub(crate) role: Role,
    /// The program's source: the process compiles it once and keeps it.
    pub(crate) code: String,
    /// The input document's fields (see `shape::input`).
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) source: String,
    pub(crate) resource: Option<String>,
    pub(crate) received_at: String,
}

/// What a run gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Answer {
    /// A filter's single `true`.
    Matched,
    /// A filter's anything else, and why.
    Filtered { reason: String, error: bool },
    /// A transform's body (the frame's payload).
    Transformed,
    /// A transform that gave no single JSON value, or failed; a program that does not
    /// compile.
    Failed { reason: String },
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("the shaping process closed its socket")]
    Closed,
    #[error("a frame of {0} bytes is larger than allowed")]
    TooLarge(usize),
    #[error("a frame's head is not what was expected: {0}")]
    Head(#[from] serde_json::Error),
    #[error("the shaping process's socket failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The bytes of a frame's two lengths and head (the payload follows them unchanged).
pub(crate) fn prefix<T: Serialize>(head: &T, payload_len: usize) -> Result<Vec<u8>, WireError> {
    let head = serde_json::to_vec(head)?;
    if head.len() > MAX_HEAD {
        return Err(WireError::TooLarge(head.len()));
    }
    if payload_len > MAX_PAYLOAD {
        return Err(WireError::TooLarge(payload_len));
    }
    let mut out = Vec::with_capacity(8 + head.len());
    out.extend_from_slice(&len_bytes(head.len()));
    out.extend_from_slice(&head);
    out.extend_from_slice(&len_bytes(payload_len));
    Ok(out)
}

fn len_bytes(len: usize) -> [u8; 4] {
    // Both bounds are far below u32::MAX.
    u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes()
}

/// A length read off the wire, checked against its bound.
pub(crate) fn checked_len(bytes: [u8; 4], max: usize) -> Result<usize, WireError> {
    let len = u32::from_le_bytes(bytes) as usize;
    if len > max {
        return Err(WireError::TooLarge(len));
    }
    Ok(len)
}

/// Blocking frame I/O, for the shaping process (one job at a time).
pub(crate) mod blocking {
    use std::io::{ErrorKind, Read, Write};

    use super::*;

    fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), WireError> {
        r.read_exact(buf).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => WireError::Closed,
            _ => WireError::Io(e),
        })
    }

    /// Reads one frame: its head and payload.
    pub(crate) fn read<T: serde::de::DeserializeOwned>(
        r: &mut impl Read,
    ) -> Result<(T, Vec<u8>), WireError> {
        let mut len = [0u8; 4];
        read_exact(r, &mut len)?;
        let mut head = vec![0u8; checked_len(len, MAX_HEAD)?];
        read_exact(r, &mut head)?;
        read_exact(r, &mut len)?;
        let mut payload = vec![0u8; checked_len(len, MAX_PAYLOAD)?];
        read_exact(r, &mut payload)?;
        Ok((serde_json::from_slice(&head)?, payload))
    }

    /// Writes one frame.
    pub(crate) fn write<T: Serialize>(
        w: &mut impl Write,
        head: &T,
        payload: &[u8],
    ) -> Result<(), WireError> {
        w.write_all(&prefix(head, payload.len())?)?;
        w.write_all(payload)?;
        w.flush()?;
        Ok(())
    }
}

/// Frame I/O on the relay's side, awaited.
pub(crate) mod nonblocking {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn read_exact(
        r: &mut (impl AsyncReadExt + Unpin),
        buf: &mut [u8],
    ) -> Result<(), WireError> {
        r.read_exact(buf).await.map(|_| ()).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => WireError::Closed,
            _ => WireError::Io(e),
        })
    }

    /// Reads one frame: its head and payload.
    pub(crate) async fn read<T: serde::de::DeserializeOwned>(
        r: &mut (impl AsyncReadExt + Unpin),
    ) -> Result<(T, Vec<u8>), WireError> {
        let mut len = [0u8; 4];
        read_exact(r, &mut len).await?;
        let mut head = vec![0u8; checked_len(len, MAX_HEAD)?];
        read_exact(r, &mut head).await?;
        read_exact(r, &mut len).await?;
        let mut payload = vec![0u8; checked_len(len, MAX_PAYLOAD)?];
        read_exact(r, &mut payload).await?;
        Ok((serde_json::from_slice(&head)?, payload))
    }

    /// Writes one frame.
    pub(crate) async fn write<T: Serialize>(
        w: &mut (impl AsyncWriteExt + Unpin),
        head: &T,
        payload: &[u8],
    ) -> Result<(), WireError> {
        w.write_all(&prefix(head, payload.len())?).await?;
        w.write_all(payload).await?;
        w.flush().await?;
        Ok(())
    }
}
