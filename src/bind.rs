//! A listener that cannot bind, said with what to do about it: one message for the
//! relay's two listeners and the simulator's one.

/// A listener that cannot bind, said with what to do about it.
pub(crate) fn error(e: std::io::Error, key: &str, addr: std::net::SocketAddr) -> anyhow::Error {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            ": another process listens on {addr} (another hookrelay? `ss -ltnp 'sport = :{}'` shows which): stop it, or set another {key}",
            addr.port()
        ),
        std::io::ErrorKind::PermissionDenied => ": ports below 1024 need privileges: use a higher \
             port behind a proxy, or grant CAP_NET_BIND_SERVICE"
            .to_owned(),
        std::io::ErrorKind::AddrNotAvailable => {
            format!(": {} is not an address of this machine; 0.0.0.0 listens on all", addr.ip())
        }
        _ => String::new(),
    };
    anyhow::anyhow!("binding {key} {addr}: {e}{hint}")
}
