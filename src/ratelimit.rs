//! Repeated log lines, limited: near a full disk every refused write logged a line of its own
//! (13,800 lines, 1.4 MB, onto that same disk). A call site of `warn_limited!` or
//! `error_limited!` logs its first line at once and then at most one line per `INTERVAL` for
//! each key, carrying `suppressed = N`: the lines it left out since the one before.
//!
//! A key names the rule broken or the failure (`Error::rule`), never text a client chose: it
//! is a `&'static str`, so it cannot carry a name's length, a character or a path. Keying by a
//! refusal's message let any process on the mount cycle through 200 name lengths and have
//! every refusal logged (20,000 lookups, 9.4 MB of log in 0.7 s). A call site remembers
//! `KEYS` keys and forgets none; keys past them share one more slot, so no sequence of keys
//! logs more than `KEYS + 1` lines per interval.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per call site and key in this long.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Keys remembered per call site (a call site names a few rules; this is a bound, not a
/// working set). Keys past them are limited together, in one shared slot.
const KEYS: usize = 64;

/// When a key last logged, and the lines it left out since.
#[derive(Clone, Copy)]
struct Slot {
    last: Instant,
    left_out: u64,
}

impl Slot {
    /// Counts a line at `now`: `Some(lines left out since the last)` when it may be logged.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if now.saturating_duration_since(self.last) >= INTERVAL {
            let left_out = self.left_out;
            self.last = now;
            self.left_out = 0;
            Some(left_out)
        } else {
            self.left_out += 1;
            None
        }
    }
}

/// The state of one call site: a slot per key, and the one every key past `KEYS` shares.
pub struct RateLimit {
    slots: Mutex<Slots>,
}

struct Slots {
    keyed: Vec<(&'static str, Slot)>,
    overflow: Option<Slot>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new()
    }
}

impl RateLimit {
    pub const fn new() -> RateLimit {
        RateLimit {
            slots: Mutex::new(Slots {
                keyed: Vec::new(),
                overflow: None,
            }),
        }
    }

    /// Whether a line for `key` may be logged now: `Some(lines left out since the last)`, or
    /// None (counted).
    pub fn admit(&self, key: &'static str) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&self, key: &'static str, now: Instant) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let Slots { keyed, overflow } = &mut *slots;
        if let Some((_, s)) = keyed.iter_mut().find(|(k, _)| *k == key) {
            return s.admit(now);
        }
        let first = Slot {
            last: now,
            left_out: 0,
        };
        if keyed.len() < KEYS {
            keyed.push((key, first));
            return Some(0);
        }
        // A full table admits no new key at once: the keys past it take turns in one slot.
        match overflow {
            Some(s) => s.admit(now),
            None => {
                *overflow = Some(first);
                Some(0)
            }
        }
    }
}

/// A tracing event at `$level`, limited per call site (and per `key: K;` when given, a
/// `&'static str` naming the rule or failure).
#[macro_export]
macro_rules! log_limited {
    ($level:expr, key: $key:expr; $($arg:tt)+) => {{
        static LIMIT: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        if let Some(suppressed) = LIMIT.admit($key) {
            if suppressed == 0 {
                tracing::event!($level, $($arg)+);
            } else {
                tracing::event!($level, suppressed, $($arg)+);
            }
        }
    }};
    ($level:expr, $($arg:tt)+) => {
        $crate::log_limited!($level, key: ""; $($arg)+)
    };
}

/// `tracing::warn!`, at most once per `ratelimit::INTERVAL` per call site (and key).
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => { $crate::log_limited!(tracing::Level::WARN, $($arg)+) };
}

/// `tracing::error!`, at most once per `ratelimit::INTERVAL` per call site (and key).
#[macro_export]
macro_rules! error_limited {
    ($($arg:tt)+) => { $crate::log_limited!(tracing::Level::ERROR, $($arg)+) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_at_once_then_one_per_interval_with_the_count() {
        let l = RateLimit::new();
        let t = Instant::now();
        assert_eq!(l.admit_at("one", t), Some(0));
        for i in 1..1000 {
            assert_eq!(l.admit_at("one", t + Duration::from_millis(i)), None);
        }
        // Another key is its own.
        assert_eq!(l.admit_at("two", t), Some(0));
        assert_eq!(l.admit_at("one", t + INTERVAL), Some(999));
        assert_eq!(l.admit_at("one", t + INTERVAL), None);
        assert_eq!(l.admit_at("one", t + INTERVAL * 2), Some(1));
    }

    /// Regression: a call site remembered 64 keys and a new one evicted the oldest and was
    /// logged at once, so a client cycling through more messages than that (200 name lengths
    /// in a refusal's text) had every line logged. However many keys come, and however often,
    /// an interval logs at most one line per key the table holds and one for all the rest.
    #[test]
    fn more_keys_than_the_table_holds_log_no_more_than_it_does() {
        let keys: Vec<&'static str> = (0..KEYS * 4)
            .map(|i| &*Box::leak(format!("rule {i}").into_boxed_str()))
            .collect();
        let l = RateLimit::new();
        let t = Instant::now();
        let mut logged = 0;
        for round in 0..50u64 {
            for (i, k) in keys.iter().enumerate() {
                let now = t + Duration::from_micros(round * 1000 + i as u64);
                logged += u64::from(l.admit_at(k, now).is_some());
            }
        }
        assert_eq!(logged, KEYS as u64 + 1, "lines logged in one interval");
        // The next interval: again one line per remembered key and one for the rest, each
        // with the count of what it left out.
        let mut left_out = 0;
        for k in &keys {
            if let Some(n) = l.admit_at(k, t + INTERVAL * 2) {
                left_out += n;
                logged += 1;
            }
        }
        assert_eq!(logged, 2 * (KEYS as u64 + 1));
        // Every line of the first interval was logged or counted: 50 rounds of every key.
        assert_eq!(left_out + KEYS as u64 + 1, 50 * keys.len() as u64);
    }
}
