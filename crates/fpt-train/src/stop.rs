//! Stopping runs cleanly from outside their loop: a deadline (a campaign's time budget,
//! `fpt run-table --budget`) or a request (SIGINT/SIGTERM to the `fpt` binary, Ctrl-C in
//! Python). The training loop asks [`due`] after every step; when a stop is due it writes a
//! checkpoint and returns [`TrainError::Stopped`](crate::TrainError::Stopped), so the next
//! call (on any machine that has the run directory) resumes where it stopped.
//!
//! Process-wide, as a signal is: every run of the process stops. A child process that
//! trains a run (`fpt run-cell`) takes its parent's deadline from the environment
//! ([`DEADLINE_ENV`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// A flag set from outside (a signal handler's), watched beside [`REQUESTED`].
static WATCHED: std::sync::OnceLock<std::sync::Arc<AtomicBool>> = std::sync::OnceLock::new();
/// The deadline in milliseconds since the Unix epoch; 0: none.
static DEADLINE_MS: AtomicU64 = AtomicU64::new(0);

/// The environment variable a child process reads its deadline from: seconds since the Unix
/// epoch (a decimal number).
pub const DEADLINE_ENV: &str = "FPT_DEADLINE";

/// Why a run stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A stop was requested (a signal, Ctrl-C).
    Requested,
    /// The time budget ran out.
    Deadline,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Requested => "a stop was requested (interrupt)",
            Why::Deadline => "the time budget ran out",
        })
    }
}

/// Watches `flag` (e.g. one a signal handler sets, `signal_hook::flag::register`): once it
/// is set, a stop is requested. The first call's flag is the one watched.
pub fn watch(flag: std::sync::Arc<AtomicBool>) {
    let _ = WATCHED.set(flag);
}

/// Asks every run of this process to stop at its next step.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Withdraws a request (the next run may start).
pub fn clear_request() {
    REQUESTED.store(false, Ordering::SeqCst);
    if let Some(f) = WATCHED.get() {
        f.store(false, Ordering::SeqCst);
    }
}

/// Sets (or with `None` removes) the deadline.
pub fn set_deadline(at: Option<SystemTime>) {
    let ms = at
        .map(|t| {
            t.duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_millis()
                .max(1) as u64
        })
        .unwrap_or(0);
    DEADLINE_MS.store(ms, Ordering::SeqCst);
}

/// The deadline, if one is set.
pub fn deadline() -> Option<SystemTime> {
    match DEADLINE_MS.load(Ordering::SeqCst) {
        0 => None,
        ms => Some(UNIX_EPOCH + Duration::from_millis(ms)),
    }
}

/// Reads the deadline from [`DEADLINE_ENV`] (a child's parent's); an unreadable value is
/// an error naming the variable.
pub fn deadline_from_env() -> Result<Option<SystemTime>, String> {
    match std::env::var(DEADLINE_ENV) {
        Err(_) => Ok(None),
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| Some(UNIX_EPOCH + Duration::from_secs_f64(s)))
            .ok_or_else(|| format!("{DEADLINE_ENV}={v:?}: expected seconds since the Unix epoch")),
    }
}

/// The value of [`DEADLINE_ENV`] for `at`.
pub fn deadline_env_value(at: SystemTime) -> String {
    format!(
        "{:.3}",
        at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs_f64()
    )
}

/// Whether a stop is due now, and why.
pub fn due() -> Option<Why> {
    if REQUESTED.load(Ordering::SeqCst) || WATCHED.get().is_some_and(|f| f.load(Ordering::SeqCst)) {
        return Some(Why::Requested);
    }
    match deadline() {
        Some(d) if SystemTime::now() >= d => Some(Why::Deadline),
        _ => None,
    }
}

/// The longest duration [`parse_duration`] takes: a year (a budget past it is a typo).
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses a duration such as `2h`, `40m`, `2h30m`, `90s` or `1.5h` (a bare number is
/// minutes), at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs = parse_seconds(s)?;
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "`{s}`: {secs:.3e} s is longer than the {} days a duration may be",
            MAX_DURATION.as_secs() / 86400
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let bad = || format!("`{s}`: expected a duration such as 2h, 45m, 2h30m or 90s");
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(m) = t.parse::<f64>() {
        return (m.is_finite() && m >= 0.0).then_some(m * 60.0).ok_or_else(bad);
    }
    let mut total = 0.0;
    let mut num = String::new();
    for c in t.chars() {
        match c {
            '0'..='9' | '.' => num.push(c),
            'h' | 'm' | 's' => {
                let v: f64 = num.parse().map_err(|_| bad())?;
                total += v * match c {
                    'h' => 3600.0,
                    'm' => 60.0,
                    _ => 1.0,
                };
                num.clear();
            }
            _ => return Err(bad()),
        }
    }
    if !num.is_empty() || !total.is_finite() {
        return Err(bad());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_bad_ones_are_named() {
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("2h30m").unwrap(), Duration::from_secs(9000));
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("45").unwrap(), Duration::from_secs(2700));
        for bad in ["", "2x", "h", "2h3", "-1"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("expected a duration"), "{bad}: {e}");
        }
        // Past a year: an error, not a panic (Duration::from_secs_f64 overflows).
        for huge in ["1e99", "99999999999999999999h", "9000h"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("longer than the 366 days"), "{huge}: {e}");
        }
    }
}
