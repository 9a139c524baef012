//! TensorBoard event files in every run directory: what TensorBoard, W&B
//! (`wandb sync --sync-tensorboard`) and most dashboards read.
//!
//! A file `events.out.tfevents.<unix time>.<host>.fpt` is a sequence of records, each an
//! `Event` protobuf (TensorFlow's `event.proto`: wall time, step, and a `Summary` of tagged
//! scalar values) framed as TFRecord: the length (u64, little-endian), its masked CRC32C,
//! the bytes, their masked CRC32C. The first event names the file version
//! (`brain.Event:2`). The run loop writes the training loss, learning rate and gradient norm
//! of every step and the metrics of every evaluation, and flushes at each evaluation; a
//! resumed run starts a file of its own (TensorBoard reads a directory's files together).

use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `tensorflow.Summary.Value` with a scalar (`simple_value`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The series' name (`train/loss`, `test/accuracy`, ...).
    #[prost(string, tag = "1")]
    pub tag: String,
    /// The value.
    #[prost(float, tag = "2")]
    pub simple_value: f32,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// Its values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Event` (the fields fpt writes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// The training step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The first event's file version (`brain.Event:2`).
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// Scalars.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// TFRecord's masked CRC32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Writes one run's events.
pub struct EventWriter {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventWriter {
    /// A new event file in `dir`, its version record written.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
            .unwrap_or_else(|| "localhost".into());
        let t = now();
        let mut path = dir.join(format!("events.out.tfevents.{}.{host}.fpt", t as u64));
        // Two files in one second (a resumed run): another name.
        let mut n = 1;
        while path.exists() {
            path = dir.join(format!("events.out.tfevents.{}.{host}.fpt.{n}", t as u64));
            n += 1;
        }
        let out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut w = EventWriter { path, out };
        w.record(&Event {
            wall_time: t,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        w.flush()?;
        Ok(w)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, e: &Event) -> std::io::Result<()> {
        let data = e.encode_to_vec();
        let len = (data.len() as u64).to_le_bytes();
        self.out.write_all(&len)?;
        self.out.write_all(&masked_crc(&len).to_le_bytes())?;
        self.out.write_all(&data)?;
        self.out.write_all(&masked_crc(&data).to_le_bytes())
    }

    /// Scalars at `step`, one event.
    pub fn scalars(&mut self, step: usize, values: &[(&str, f64)]) -> std::io::Result<()> {
        let value = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue {
                tag: (*tag).to_string(),
                simple_value: *v as f32,
            })
            .collect::<Vec<_>>();
        if value.is_empty() {
            return Ok(());
        }
        self.record(&Event {
            wall_time: now(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary { value }),
        })
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The event files open in this process, one per run directory.
static OPEN: std::sync::Mutex<Option<std::collections::HashMap<PathBuf, EventWriter>>> = std::sync::Mutex::new(None);

/// Writes `values` at `step` to the event file of the run directory `dir` (opened at the
/// first call for it), flushing when `flush` (at each evaluation).
pub(crate) fn log(dir: &Path, step: usize, values: &[(&str, f64)], flush: bool) -> crate::Result<()> {
    let io = |source| crate::TrainError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    let map = open.get_or_insert_with(Default::default);
    let w = match map.get_mut(dir) {
        Some(w) => w,
        None => map
            .entry(dir.to_path_buf())
            .or_insert(EventWriter::create(dir).map_err(io)?),
    };
    w.scalars(step, values).map_err(io)?;
    if flush {
        w.flush().map_err(io)?;
    }
    Ok(())
}

/// An evaluation's metrics (every `metrics.jsonl` line goes here too), flushed.
pub(crate) fn log_eval(dir: &Path, rec: &crate::EvalRecord) -> crate::Result<()> {
    let mut v = vec![
        ("test/accuracy", rec.test_accuracy),
        ("test/loss", rec.test_loss),
        ("train/loss_mean", rec.train_loss),
    ];
    if let Some(a) = rec.train_accuracy {
        v.push(("train/accuracy", a));
    }
    log(dir, rec.step, &v, true)
}

/// Flushes and closes the event file of `dir` (a run segment's end).
pub(crate) fn close(dir: &Path) -> crate::Result<()> {
    let w = OPEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(dir));
    if let Some(mut w) = w {
        w.flush().map_err(|source| crate::TrainError::Io {
            path: w.path().to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// Every event of an event file, its framing and checksums checked: what TensorBoard reads
/// (for tests and tools).
pub fn read(path: &Path) -> std::io::Result<Vec<Event>> {
    let bytes = std::fs::read(path)?;
    let bad =
        |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
    let mut events = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let take = |from: usize, n: usize| {
            bytes
                .get(from..from + n)
                .ok_or_else(|| bad(format!("truncated at byte {from}")))
        };
        let len_bytes = take(at, 8)?;
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let crc = u32::from_le_bytes(take(at + 8, 4)?.try_into().expect("4 bytes"));
        if crc != masked_crc(len_bytes) {
            return Err(bad(format!("length checksum wrong at byte {at}")));
        }
        let data = take(at + 12, len)?;
        let crc = u32::from_le_bytes(take(at + 12 + len, 4)?.try_into().expect("4 bytes"));
        if crc != masked_crc(data) {
            return Err(bad(format!("data checksum wrong at byte {at}")));
        }
        events.push(Event::decode(data).map_err(|e| bad(e.to_string()))?);
        at += 16 + len;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TFRecord's published check value: the masked CRC32C of an empty record's length field
    /// (eight zero bytes), as TensorFlow computes it. CRC32C itself is checked against the
    /// standard's check value ("123456789" -> 0xE3069283).
    #[test]
    fn framing_checksums() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let c = crc32c::crc32c(&[0u8; 8]);
        assert_eq!(masked_crc(&[0u8; 8]), c.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn written_events_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalars(1, &[("train/loss", 0.5), ("train/lr", 1e-3), ("nan", f64::NAN)])
            .unwrap();
        w.scalars(2, &[("test/accuracy", 0.75)]).unwrap();
        w.flush().unwrap();
        let ev = read(w.path()).unwrap();
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].file_version.as_deref(), Some("brain.Event:2"));
        let s = ev[1].summary.as_ref().unwrap();
        assert_eq!(ev[1].step, 1);
        assert_eq!(s.value.len(), 2, "the non-finite value is left out");
        assert_eq!((s.value[0].tag.as_str(), s.value[0].simple_value), ("train/loss", 0.5));
        assert_eq!(ev[2].summary.as_ref().unwrap().value[0].simple_value, 0.75);
        // A flipped byte is found.
        let mut bytes = std::fs::read(w.path()).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(w.path(), bytes).unwrap();
        assert!(read(w.path()).is_err());
    }
}
