//! sd_notify: tells systemd (a `Type=notify` unit) when the relay is ready and when it
//! is stopping or reloading, so `systemctl start` returns once callbacks are accepted.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (`READY=1`, `STOPPING=1`, ...) to `$NOTIFY_SOCKET` when systemd set
/// one; does nothing otherwise. A failure is logged, never fatal: the relay works the
/// same without a supervisor listening.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let sent = (|| -> std::io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        match path.as_encoded_bytes().strip_prefix(b"@") {
            // An abstract socket (the usual case under systemd).
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(state.as_bytes(), &addr)?;
            }
            None => {
                socket.send_to(state.as_bytes(), &path)?;
            }
        }
        Ok(())
    })();
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// `CLOCK_MONOTONIC` in µs: what `RELOADING=1` carries as `MONOTONIC_USEC` (systemd
/// tells a reload it asked from an earlier one by it).
pub(crate) fn monotonic_us() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the struct it is given.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if read != 0 {
        return 0;
    }
    (now.tv_sec as u64).saturating_mul(1_000_000) + now.tv_nsec as u64 / 1000
}
