//! Repeated log lines, limited: near a full disk every refused write logged a line of its own
//! (13,800 lines, 1.4 MB, onto that same disk). A call site of `warn_limited!` or
//! `error_limited!` logs its first line at once and then at most one line per `INTERVAL` for
//! each key, carrying `suppressed = N`: the lines it left out since the one before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per call site and key in this long.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Keys remembered per call site; the oldest goes first.
const KEYS: usize = 64;

/// The state of one call site: per key, when it last logged and what it left out since.
pub struct RateLimit {
    slots: Mutex<Vec<(u64, Instant, u64)>>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new()
    }
}

impl RateLimit {
    pub const fn new() -> RateLimit {
        RateLimit {
            slots: Mutex::new(Vec::new()),
        }
    }

    /// Whether a line for `key` may be logged now: `Some(lines left out since the last)`, or
    /// None (counted).
    pub fn admit(&self, key: u64) -> Option<u64> {
        self.admit_at(key, Instant::now())
    }

    fn admit_at(&self, key: u64, now: Instant) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.iter_mut().find(|s| s.0 == key) {
            Some(s) if now.saturating_duration_since(s.1) >= INTERVAL => {
                let left_out = s.2;
                s.1 = now;
                s.2 = 0;
                Some(left_out)
            }
            Some(s) => {
                s.2 += 1;
                None
            }
            None => {
                if slots.len() >= KEYS {
                    slots.remove(0);
                }
                slots.push((key, now, 0));
                Some(0)
            }
        }
    }
}

/// The key of a message: lines that say the same thing (the same rule, the same failure) are
/// limited together, whatever path they name.
pub fn key_of(what: impl std::fmt::Display) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    what.to_string().hash(&mut h);
    h.finish()
}

/// A tracing event at `$level`, limited per call site (and per `key: K;` when given).
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
        $crate::log_limited!($level, key: 0; $($arg)+)
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
        assert_eq!(l.admit_at(1, t), Some(0));
        for i in 1..1000 {
            assert_eq!(l.admit_at(1, t + Duration::from_millis(i)), None);
        }
        // Another key is its own.
        assert_eq!(l.admit_at(2, t), Some(0));
        assert_eq!(l.admit_at(1, t + INTERVAL), Some(999));
        assert_eq!(l.admit_at(1, t + INTERVAL), None);
        assert_eq!(l.admit_at(1, t + INTERVAL * 2), Some(1));
    }
}
