//! SIGTERM: readiness drops, in-flight callbacks finish and are stored, exit code 0.

use crate::common;

use std::time::Duration;

use common::{Relay, SOURCE, TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_in_flight_callbacks_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "");
    let mut relay = Relay::start(dir.path(), &text).await;

    // A callback whose body is only half sent when the signal arrives.
    let body = br#"{"data":{"type":"actions","id":"77"},"meta":{}}"#;
    let (first, rest) = body.split_at(20);
    let mut conn = tokio::net::TcpStream::connect(relay.ingress).await.unwrap();
    let head = format!(
        "POST /hooks/{SOURCE}/{TOKEN}/ActionCreated HTTP/1.1\r\nHost: relay\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(first).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    relay.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ready = relay.client.get(format!("http://{}/readyz", relay.admin)).send().await.unwrap();
    assert_eq!(ready.status(), 503, "not ready while draining");

    conn.write_all(rest).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("answer within the grace period")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let status = relay.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "logs:\n{}", relay.logs());
    let logs = relay.logs();
    assert!(logs.contains("SIGTERM") && logs.contains("\"stopped\""), "{logs}");
    drop(relay);

    let relay = Relay::start(dir.path(), &text).await;
    let (_, list) = relay.admin_get("/admin/events").await;
    let events = list["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{list}");
    let id = events[0]["id"].as_str().unwrap();
    let (_, e) = relay.admin_get(&format!("/admin/events/{id}")).await;
    assert_eq!(e["body"].as_str().unwrap().as_bytes(), body);
}

#[tokio::test]
async fn sigint_when_idle_exits_0_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::config(&dir.path().join("data"), "");
    let mut relay = Relay::start(dir.path(), &text).await;
    assert_eq!(relay.callback(None, "application/json", "{}").await.status(), 200);
    relay.signal(libc::SIGINT);
    let status = relay.wait_exit(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "logs:\n{}", relay.logs());
}

/// `Type=notify`: READY=1 once the relay accepts callbacks, STOPPING=1 on SIGTERM, on
/// the datagram socket systemd names in `$NOTIFY_SOCKET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_is_notified_of_readiness_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let text = common::config(&dir.path().join("data"), "");
    let mut relay =
        Relay::start_env(dir.path(), &text, &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())])
            .await;
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).unwrap();
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    // Ready means ready: a callback is accepted right away.
    let r = relay.callback(Some("ActionCreated"), "application/json", "{}").await;
    assert_eq!(r.status(), 200);

    relay.signal(libc::SIGTERM);
    let n = socket.recv(&mut buf).unwrap();
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert!(relay.wait_exit(Duration::from_secs(20)).success());
}
