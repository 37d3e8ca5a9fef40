//! ISO 8601 / RFC 3339 timestamps with a UTC offset, the form the upstream uses
//! (`2026-06-12T13:23:34+12:00`), without pulling in a date-time crate for two functions.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `t` as `YYYY-MM-DDTHH:MM:SS+00:00` (whole seconds, UTC).
pub(crate) fn format_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+00:00", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// `t` as the admin API shows every time: RFC 3339 in UTC with microseconds and `Z`
/// (`2026-06-12T01:23:34.000000Z`), one format for events, deliveries and hooks.
pub(crate) fn format_admin(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// Microseconds since the Unix epoch as [`format_admin`] shows a time.
pub(crate) fn format_admin_us(us: u64) -> String {
    format_admin(UNIX_EPOCH + Duration::from_micros(us))
}

/// Parses `YYYY-MM-DD[T ]HH:MM:SS[.fff](Z|±HH:MM|±HHMM)`; `None` for anything else
/// (including the empty string the upstream uses for "never").
pub(crate) fn parse(text: &str) -> Option<SystemTime> {
    let b = text.trim().as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = std::str::from_utf8(b.get(from..from + len)?).ok()?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let sep_ok = b[4] == b'-' && b[7] == b'-' && matches!(b[10], b'T' | b't' | b' ');
    if !sep_ok || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (h, mi, s) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = std::str::from_utf8(&b[start..i.min(start + 9)]).ok()?;
        if digits.is_empty() {
            return None;
        }
        nanos = digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32);
    }
    let offset_secs: i64 = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), rest @ ..] => {
            let (oh, om) = match rest {
                [_, _, b':', _, _] => (num(i + 1, 2)?, num(i + 4, 2)?),
                [_, _, _, _] => (num(i + 1, 2)?, num(i + 3, 2)?),
                _ => return None,
            };
            let off = oh * 3600 + om * 60;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn formats_and_parses_back() {
        for secs in [0, 951_782_400, 1_781_228_615, 4_102_444_800] {
            let text = format_utc(at(secs));
            assert_eq!(parse(&text), Some(at(secs)), "{text}");
        }
        assert_eq!(format_utc(at(1_781_228_615)), "2026-06-12T01:43:35+00:00");
    }

    #[test]
    fn honours_offsets_and_fractions() {
        let utc = parse("2026-06-12T01:23:34Z").unwrap();
        assert_eq!(parse("2026-06-12T13:23:34+12:00"), Some(utc));
        assert_eq!(parse("2026-06-11T20:23:34-0500"), Some(utc));
        assert_eq!(parse("2026-06-12 01:23:34+00:00"), Some(utc));
        let frac = parse("2026-06-12T01:23:34.250Z").unwrap();
        assert_eq!(frac.duration_since(utc).unwrap(), Duration::from_millis(250));
    }

    #[test]
    fn rejects_what_is_not_a_timestamp() {
        for bad in [
            "",
            "never",
            "2026-06-12",
            "2026-13-01T00:00:00Z",
            "2026-06-12T01:23:34",
            "2026-06-12T01:23:34+1",
            "2026-06-12X01:23:34Z",
            "2026-06-12T01:23:34.Z",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
