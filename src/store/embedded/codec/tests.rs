//! The codec's tests: every record and decision read back as written, old layouts included.

#[test]
fn a_stripped_record_keeps_its_flags_resource_and_meta() {
    let mut meta = crate::store::fixtures::received("demo", "A", 7, "{}").meta;
    meta.resource = Some("actions/1".into());
    let value = super::encode_record(&meta, Some(b"the body")).unwrap();
    let stripped = super::strip_body(&value).unwrap().unwrap();
    assert_eq!(stripped.len(), value.len() - 8);
    let parts = super::split_record(&stripped).unwrap();
    assert_eq!((parts.body, parts.resource), (None, Some("actions/1")));
    assert!(super::awaits_outcome(&stripped), "its other flags stay");
    assert_eq!(super::decode_meta(&stripped).unwrap(), super::decode_meta(&value).unwrap());
    assert_eq!(super::strip_body(&stripped).unwrap(), None, "nothing left to strip");
}

use super::*;

fn meta(status: EventStatus) -> EventMeta {
    EventMeta {
        source: "demo".into(),
        event: "ActionCreated".into(),
        event_from: EventNameOrigin::Body,
        received_at_us: 42,
        size: 3,
        content_type: None,
        headers: vec![("user-agent".into(), "x".into())],
        remote_addr: None,
        status,
        flags: vec![EventFlag::NotJson],
        reason: None,
        duplicate_of: None,
        destinations: Vec::new(),
        resource: None,
    }
}

#[test]
fn records_round_trip_and_reject_truncation() {
    let m = meta(EventStatus::Received);
    let bytes = encode_record(&m, Some(b"a\0b")).unwrap();
    let r = split_record(&bytes).unwrap();
    assert!(awaits_outcome(&bytes));
    assert_eq!(r.body, Some(&b"a\0b"[..]));
    assert_eq!(decode_meta(&bytes).unwrap(), m);
    let empty = encode_record(&m, Some(b"")).unwrap();
    assert_eq!(split_record(&empty).unwrap().body, Some(&b""[..]));
    let rejected = encode_record(&meta(EventStatus::Rejected), None).unwrap();
    let r = split_record(&rejected).unwrap();
    assert!(!awaits_outcome(&rejected) && r.body.is_none());
    assert!(split_record(&bytes[..3]).is_err());
    assert!(split_record(&bytes[..10]).is_err());
    assert!(split_record(b"").is_err());
}

#[test]
fn the_resource_travels_in_the_header() {
    let mut m = meta(EventStatus::Received);
    m.resource = Some("actions/5".into());
    let bytes = encode_record(&m, Some(b"{}")).unwrap();
    let parts = split_record(&bytes).unwrap();
    assert_eq!((parts.resource, parts.body), (Some("actions/5"), Some(&b"{}"[..])));
    assert_eq!(decode_meta(&bytes).unwrap(), m);
    let id = EventId::new(7);
    assert_eq!(
        outcome_key(&id.to_key(), &bytes).unwrap(),
        super::super::keys::outcome(id, Some("actions/5"))
    );
    let plain = encode_record(&meta(EventStatus::Received), None).unwrap();
    assert_eq!(outcome_key(&id.to_key(), &plain).unwrap(), id.to_key());
    for cut in 5..bytes.len() - 2 {
        assert!(decode_meta(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn metas_round_trip_in_both_forms_and_binary_is_smaller() {
    let mut m = meta(EventStatus::Duplicate);
    m.content_type = Some("application/json".into());
    m.remote_addr = Some("10.0.0.1:5555".into());
    m.reason = Some("why".into());
    m.duplicate_of = Some(EventId::new(9));
    m.destinations = vec!["crm".into(), "erp".into()];
    m.flags = vec![EventFlag::Empty, EventFlag::NotJson, EventFlag::Oversized];
    for origin in [EventNameOrigin::Path, EventNameOrigin::Unknown, EventNameOrigin::Internal] {
        m.event_from = origin;
        let binary = encode_meta(&m);
        assert_eq!(parse_meta(&binary), Ok(m.clone()));
        let json = serde_json::to_vec(&m).unwrap();
        assert_eq!(parse_meta(&json), Ok(m.clone()));
        assert!(binary.len() * 2 < json.len(), "{} vs {}", binary.len(), json.len());
        for cut in 0..binary.len() {
            assert!(parse_meta(&binary[..cut]).is_err(), "cut at {cut}");
        }
    }
    for status in [EventStatus::Received, EventStatus::Rejected, EventStatus::Unrouted] {
        let m = meta(status);
        assert_eq!(parse_meta(&encode_meta(&m)), Ok(m));
    }
    assert!(parse_meta(&[7]).unwrap_err().contains("version 7"));
}

#[test]
fn an_outcome_sets_exactly_what_dispatch_changes() {
    let stored = meta(EventStatus::Received);
    let mut dispatched = stored.clone();
    dispatched.status = EventStatus::Duplicate;
    dispatched.duplicate_of = Some(EventId::new(7));
    dispatched.destinations = vec!["crm".into()];
    let encoded = serde_json::to_vec(&DispatchRecord::of(&dispatched)).unwrap();
    assert!(encoded.len() < 64, "{}", String::from_utf8_lossy(&encoded));
    let mut read = stored;
    serde_json::from_slice::<DispatchRecord>(&encoded).unwrap().apply_to(&mut read);
    assert_eq!(read, dispatched);
}
