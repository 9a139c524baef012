//! A run's `history.jsonl`: one line per segment (a start or resume to its end or stop),
//! saying where and how each stretch of a run that crossed machines ran.

use crate::selfcheck;
use crate::{device_name, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Instant;

/// One segment of a run (a start or resume to its end or stop), a line of its `history.jsonl`:
/// where each stretch of a run that crossed machines (CPUs, a GPU) ran.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Segment {
    /// When the segment ended (UTC, RFC 3339 to the second).
    pub ended_utc: String,
    /// The step it started from.
    pub from_step: usize,
    /// The step it reached.
    pub to_step: usize,
    /// Its wall-clock seconds.
    pub seconds: f64,
    /// The device (`cpu`, `cuda:0`).
    pub device: String,
    /// The machine: the CPU's model and the kernel path, or the GPU.
    pub machine: String,
    /// The build's commit.
    pub commit: String,
    /// How it ended.
    pub how: String,
    /// On a GPU, `own`: the device had a stream of its own (else see [`Segment::raced`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_stream: Option<String>,
    /// `replay` when its steps went through the replayed step (by default on a GPU; a CUDA
    /// graph of the step on a GPU); absent for eager steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

impl Segment {
    /// A GPU stretch of a build before `2cadb44`'s one-stream fix (docs/correctness.md).
    pub fn raced(&self) -> bool {
        self.device.starts_with("cuda") && self.cuda_stream.as_deref() != Some("own")
    }
}

pub(crate) fn append(
    out_dir: &Path,
    from_step: usize,
    to_step: usize,
    started: &Instant,
    device: &Device,
    how: &str,
    replayed: bool,
) -> Result<()> {
    let p = selfcheck::provenance();
    let seg = Segment {
        ended_utc: utc_now(),
        from_step,
        to_step,
        seconds: started.elapsed().as_secs_f64(),
        device: device_name(device),
        machine: if device.is_cpu() {
            format!("{} ({} path)", p.cpu, p.kernel_path)
        } else {
            format!("{} (host CPU {})", device_name(device), p.cpu)
        },
        commit: p.commit,
        how: how.to_string(),
        cuda_stream: (!device.is_cpu()).then(|| "own".to_string()),
        step: replayed.then(|| "replay".to_string()),
    };
    crate::run_dir::append_line(
        &out_dir.join("history.jsonl"),
        &serde_json::to_string(&seg).expect("a segment serialises"),
    )
}

/// Now, UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc_now() -> String {
    utc_of(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()) as i64,
    )
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, proleptic
/// Gregorian).
fn utc_of(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dates as `date -u -d @SECS +%Y-%m-%dT%H:%M:%SZ` prints them.
    #[test]
    fn utc_dates_match_gnu_date() {
        assert_eq!(utc_of(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_of(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_of(1_795_739_274), "2026-11-27T00:27:54Z");
    }
}
