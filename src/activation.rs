//! systemd socket activation: the listeners the service manager holds and hands to each
//! start of the relay (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`; sd_listen_fds(3)).
//!
//! Why: a listener the relay binds itself is closed while it restarts, and every
//! callback sent meanwhile is refused. A listener systemd holds (deploy/systemd's
//! `hookrelay.socket`) stays open across restarts and upgrades: callbacks wait in the
//! kernel's queue and the next start answers them. `systemd-socket-activate -l ADDR -l
//! ADDR --fdname=ingress:admin hookrelay serve` hands them over the same way.
//!
//! The sockets are told apart by name: `ingress` and `admin`. Unnamed (or named after
//! their unit, as systemd does when `FileDescriptorName=` is not set), the first is the
//! ingress and the second the admin listener.

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};

/// The first file descriptor handed over (sd_listen_fds(3)).
const FIRST_FD: RawFd = 3;

/// The listeners handed over by the service manager, by role; none when the relay was
/// not started that way (it binds `ingress.listen` and `admin.listen` itself).
#[derive(Debug, Default)]
pub(crate) struct Sockets {
    pub(crate) ingress: Option<TcpListener>,
    pub(crate) admin: Option<TcpListener>,
}

/// Handed-over sockets the relay cannot use: said with what to do.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ActivationError {
    #[error(
        "LISTEN_FDNAMES names {0:?}: hookrelay takes sockets named \"ingress\" and \"admin\" \
         (FileDescriptorName= in the socket units, or --fdname=ingress:admin)"
    )]
    UnknownName(String),
    #[error("two sockets are named {0:?}: name one \"ingress\" and the other \"admin\"")]
    Twice(&'static str),
    #[error(
        "{0} sockets were handed over (LISTEN_FDS): hookrelay takes at most two, the ingress \
         and the admin listener"
    )]
    TooMany(usize),
    #[error(
        "LISTEN_FDS={0:?} is not a number of sockets: start the relay from a socket unit or \
         systemd-socket-activate, or unset it"
    )]
    Malformed(String),
    #[error(
        "the socket handed over as {role} (fd {fd}) is not a listening TCP socket: use \
         ListenStream= with an address and port"
    )]
    NotListening { role: &'static str, fd: RawFd },
}

/// Which role each handed-over descriptor has, from how many there are and their
/// names (`LISTEN_FDNAMES`): `(ingress, admin)` as offsets from the first.
fn assign(
    count: usize,
    names: Option<&str>,
) -> Result<(Option<usize>, Option<usize>), ActivationError> {
    if count > 2 {
        return Err(ActivationError::TooMany(count));
    }
    let names: Vec<&str> = names.map(|n| n.split(':').collect()).unwrap_or_default();
    let named = |n: &&str| *n == "ingress" || *n == "admin";
    if !names.iter().take(count).any(named) {
        // Unnamed: in order.
        return Ok(((count > 0).then_some(0), (count > 1).then_some(1)));
    }
    let (mut ingress, mut admin) = (None, None);
    for (i, name) in names.iter().take(count).enumerate() {
        let slot = match *name {
            "ingress" => &mut ingress,
            "admin" => &mut admin,
            other => return Err(ActivationError::UnknownName(other.to_owned())),
        };
        if slot.replace(i).is_some() {
            return Err(ActivationError::Twice(if *name == "ingress" {
                "ingress"
            } else {
                "admin"
            }));
        }
    }
    Ok((ingress, admin))
}

/// The sockets handed over to this process, if any: read once, at start. `LISTEN_PID`
/// names the process they are for; another's (a parent's) are left alone.
pub(crate) fn take(
    env: &std::collections::HashMap<String, String>,
) -> Result<Sockets, ActivationError> {
    let for_us = env.get("LISTEN_PID").and_then(|p| p.trim().parse::<u32>().ok())
        == Some(std::process::id());
    let Some(count) = env.get("LISTEN_FDS").filter(|_| for_us) else {
        return Ok(Sockets::default());
    };
    let count: usize =
        count.trim().parse().map_err(|_| ActivationError::Malformed(count.clone()))?;
    let (ingress, admin) = assign(count, env.get("LISTEN_FDNAMES").map(String::as_str))?;
    let listener = |role: &'static str,
                    offset: Option<usize>|
     -> Result<Option<TcpListener>, ActivationError> {
        let Some(offset) = offset else { return Ok(None) };
        let fd = FIRST_FD + offset as RawFd;
        if !is_listening_tcp(fd) {
            return Err(ActivationError::NotListening { role, fd });
        }
        // Not inherited by the shaping processes the relay starts.
        // SAFETY: fcntl on a descriptor this process was handed; no memory involved.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        // SAFETY: the service manager handed this descriptor to this process (LISTEN_PID
        // is ours) and nothing else here owns it: ownership passes to the listener.
        Ok(Some(unsafe { TcpListener::from_raw_fd(fd) }))
    };
    Ok(Sockets { ingress: listener("ingress", ingress)?, admin: listener("admin", admin)? })
}

/// Whether `fd` is a TCP socket that listens.
fn is_listening_tcp(fd: RawFd) -> bool {
    let option = |level, name| {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`.
        let read = unsafe {
            libc::getsockopt(fd, level, name, (&mut value as *mut libc::c_int).cast(), &mut len)
        };
        (read == 0).then_some(value)
    };
    let domain = option(libc::SOL_SOCKET, libc::SO_DOMAIN);
    option(libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(1)
        && option(libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && (domain == Some(libc::AF_INET) || domain == Some(libc::AF_INET6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_say_which_is_which_and_unnamed_ones_go_in_order() {
        assert_eq!(assign(2, Some("ingress:admin")).unwrap(), (Some(0), Some(1)));
        assert_eq!(assign(2, Some("admin:ingress")).unwrap(), (Some(1), Some(0)));
        assert_eq!(assign(1, Some("admin")).unwrap(), (None, Some(0)));
        assert_eq!(assign(2, None).unwrap(), (Some(0), Some(1)));
        assert_eq!(
            assign(2, Some("hookrelay.socket:hookrelay.socket")).unwrap(),
            (Some(0), Some(1))
        );
        assert_eq!(assign(1, None).unwrap(), (Some(0), None));
        assert_eq!(assign(0, None).unwrap(), (None, None));
    }

    #[test]
    fn a_name_it_does_not_know_or_one_twice_or_a_third_socket_is_refused_with_why() {
        let said = |r: Result<_, ActivationError>| r.unwrap_err().to_string();
        assert!(said(assign(2, Some("ingress:metrics"))).contains("\"metrics\""));
        assert!(said(assign(2, Some("ingress:ingress"))).contains("two sockets are named"));
        assert!(said(assign(3, None)).contains("at most two"));
    }

    #[test]
    fn sockets_for_another_process_are_left_alone() {
        let env = [("LISTEN_PID", "1"), ("LISTEN_FDS", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let sockets = take(&env).unwrap();
        assert!(sockets.ingress.is_none() && sockets.admin.is_none());
        let env = [("LISTEN_PID", std::process::id().to_string()), ("LISTEN_FDS", "two".into())]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert!(take(&env).unwrap_err().to_string().contains("not a number"));
    }

    #[test]
    fn a_descriptor_that_is_not_a_listening_tcp_socket_is_told_apart() {
        use std::os::fd::AsRawFd;
        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(is_listening_tcp(listening.as_raw_fd()));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(!is_listening_tcp(file.as_raw_fd()));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(!is_listening_tcp(udp.as_raw_fd()));
    }
}
