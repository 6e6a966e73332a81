//! Durations, dates and points of history as people type them, and times as `log` prints
//! them: jiff's grammars (its friendly durations, ISO 8601 and RFC 3339), always in UTC.

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Span, SpanRelativeTo, Timestamp};

/// Parses a duration into nanoseconds: `30d`, `12h`, `90m`, `45s`, `2w`, a bare number of days
/// (`30`), or anything jiff's friendly or ISO 8601 format reads (`1h30m`, `2 days`, `P1W`).
/// Days are 24 hours and weeks 7 days; a negative duration is refused.
pub fn duration_ns(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not a duration (examples: 30d, 12h, 90m, 1h30m, 2 days)");
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        // A bare number is days, as it always was.
        let days: i64 = s.parse().map_err(|_| bad())?;
        return Ok(days.saturating_mul(86_400_000_000_000));
    }
    let span: Span = s.parse().map_err(|_| bad())?;
    // Months and years have no fixed length: refused.
    let d = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| bad())?;
    if d.is_negative() {
        return Err(format!("{s:?}: a duration here cannot be negative"));
    }
    Ok(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Parses a date or time into nanoseconds since the epoch: `2026-01-31` (midnight UTC),
/// `2026-01-31T08:00[:00]` or with a space (UTC), or an RFC 3339 time with its offset
/// (`2026-01-31T08:00:00Z`, `2026-01-31T10:00:00+02:00`).
pub fn date_ns(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not a date (examples: 2026-01-31, 2026-01-31T08:00:00Z)");
    if let Ok(t) = s.parse::<Timestamp>() {
        return i64::try_from(t.as_nanosecond()).map_err(|_| bad());
    }
    // A civil time is UTC; a trailing `Z` on a date alone is accepted, as it always was, and
    // so are fields without their leading zero (`2026-1-5T8:00`).
    let civil = s.trim_end_matches(['Z', 'z']);
    let dt = civil_time(civil)
        .or_else(|| civil_time(&zero_padded(civil)?))
        .ok_or_else(bad)?;
    let t = TimeZone::UTC.to_timestamp(dt).map_err(|_| bad())?;
    i64::try_from(t.as_nanosecond()).map_err(|_| bad())
}

/// A date and time, or a date alone at midnight.
fn civil_time(s: &str) -> Option<DateTime> {
    s.parse::<DateTime>()
        .ok()
        .or_else(|| Some(s.parse::<Date>().ok()?.to_datetime(Time::midnight())))
}

/// `2026-1-5T8:0` as `2026-01-05T08:00`; None unless every field is digits.
fn zero_padded(s: &str) -> Option<String> {
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t)),
        None => (s, None),
    };
    let pad = |part: &str, sep: char| -> Option<String> {
        let fields: Vec<String> = part
            .split(sep)
            .map(|f| {
                (!f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())).then(|| format!("{f:0>2}"))
            })
            .collect::<Option<_>>()?;
        Some(fields.join(&sep.to_string()))
    };
    let mut out = pad(date, '-')?;
    if let Some(t) = time {
        out.push('T');
        out.push_str(&pad(t, ':')?);
    }
    Some(out)
}

/// A point of history as the store's resolver reads it: a seq (`42`, `@42`), a mark, a date or
/// a duration ago. What the resolver reads itself goes to it unchanged, so a mark still takes
/// precedence over a time; a time only jiff reads (`1h30m`, `2 days`, `2 days ago`, an RFC 3339
/// time with an offset) goes as the UTC second it names, or as whole seconds ago.
pub fn point(spec: &str) -> String {
    let s = spec.trim();
    let seq = s.trim_start_matches('@');
    let resolver_reads = (!seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit()))
        || s.starts_with("mark:")
        || crate::tools::parse_duration(s).is_ok()
        || crate::tools::parse_date(s).is_ok();
    if resolver_reads {
        return spec.to_string();
    }
    if let Ok(ns) = date_ns(s) {
        return fmt_iso(ns);
    }
    // `2 days ago` reads as a negative span: a point is always in the past.
    if let Ok(span) = s.parse::<Span>()
        && let Ok(d) = span.abs().to_duration(SpanRelativeTo::days_are_24_hours())
    {
        return format!("{}s", d.as_secs());
    }
    spec.to_string()
}

/// `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn fmt_time(ns: i64) -> String {
    strftime(ns, "%Y-%m-%d %H:%M:%S")
}

/// `YYYY-MM-DDTHH:MM:SSZ`: the form the store's resolver reads.
fn fmt_iso(ns: i64) -> String {
    strftime(ns, "%Y-%m-%dT%H:%M:%SZ")
}

fn strftime(ns: i64, format: &str) -> String {
    // Every i64 of nanoseconds (about 292 years either side of 1970) is a valid Timestamp.
    Timestamp::from_nanosecond(i128::from(ns))
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .strftime(format)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::{date_ns, duration_ns, fmt_time, point};

    const S: i64 = 1_000_000_000;

    #[test]
    fn durations() {
        assert_eq!(duration_ns("30d").unwrap(), 30 * 86_400 * S);
        assert_eq!(duration_ns("90m").unwrap(), 90 * 60 * S);
        assert_eq!(duration_ns("2w").unwrap(), 14 * 86_400 * S);
        assert_eq!(duration_ns("45s").unwrap(), 45 * S);
        assert_eq!(duration_ns("30").unwrap(), 30 * 86_400 * S);
        assert_eq!(duration_ns(" 12h ").unwrap(), 12 * 3600 * S);
        assert_eq!(duration_ns("1h30m").unwrap(), 90 * 60 * S);
        assert_eq!(duration_ns("2 days").unwrap(), 2 * 86_400 * S);
        assert!(duration_ns("soon").unwrap_err().contains("not a duration"));
        assert!(duration_ns("2h ago").unwrap_err().contains("negative"));
        assert!(duration_ns("1y").is_err());
        assert!(duration_ns("").is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(date_ns("1970-01-01").unwrap(), 0);
        assert_eq!(date_ns("1970-01-01Z").unwrap(), 0);
        assert_eq!(date_ns("2000-03-01T00:00:00Z").unwrap(), 951_868_800 * S);
        assert_eq!(date_ns("2026-11-29T12:30").unwrap(), 1_795_955_400 * S);
        assert_eq!(date_ns("2026-11-29 12:30:00").unwrap(), 1_795_955_400 * S);
        assert_eq!(
            date_ns("2026-11-29T14:30:00+02:00").unwrap(),
            1_795_955_400 * S
        );
        assert_eq!(date_ns("1970-1-2T0:1").unwrap(), 86_460 * S);
        assert!(date_ns("2026-13-01").is_err());
        assert!(date_ns("2026-02-30").is_err());
        assert!(date_ns("soon").unwrap_err().contains("not a date"));
    }

    #[test]
    fn points() {
        for same in [
            "42",
            "@42",
            "mark:v1",
            "v1",
            "2h",
            "30d",
            "2026-01-31",
            "2026-01-31T08:00",
        ] {
            assert_eq!(point(same), same);
        }
        assert_eq!(point("2026-11-29T14:30:00+02:00"), "2026-11-29T12:30:00Z");
        assert_eq!(point("1h30m"), "5400s");
        assert_eq!(point("2 days ago"), "172800s");
    }

    #[test]
    fn times() {
        assert_eq!(fmt_time(0), "1970-01-01 00:00:00");
        assert_eq!(fmt_time(1_795_955_400 * S), "2026-11-29 12:30:00");
        assert_eq!(fmt_time(-S), "1969-12-31 23:59:59");
    }
}
