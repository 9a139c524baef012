//! Upper bounds on every size fpt reads from a flag, a spec, a config or a data file,
//! checked before anything is allocated, so that one bad value is an error naming it, never
//! an abort or a hang. Each bound is far above the largest the paper uses (in parentheses); a run that
//! fits the bounds is then checked against the machine's memory (`fpt_train::memory`).

/// Transformer blocks / LSTM layers (largest in use: GPT-2 XL: 48).
pub const MAX_LAYERS: usize = 1024;
/// Hidden width (largest in use: GPT-2 XL: 1600).
pub const MAX_HIDDEN: usize = 65_536;
/// Attention heads (largest in use: 25).
pub const MAX_HEADS: usize = 4096;
/// Feed-forward width (largest in use: 6400).
pub const MAX_FFN: usize = 262_144;
/// Learned positions / tokens per example (largest in use: Longformer: 4098).
pub const MAX_POSITIONS: usize = 1 << 20;
/// Token vocabulary (largest in use: GPT-2: 50,257).
pub const MAX_VOCAB: usize = 1 << 22;
/// Classes per label (largest in use: homology: 1,195).
pub const MAX_CLASSES: usize = 1 << 20;
/// Width of one input vector (largest in use: CIFAR-10: 48; Bit Memory: 50).
pub const MAX_INPUT_WIDTH: usize = 1 << 20;
/// Examples per optimizer step or evaluation batch (largest in use: 16).
pub const MAX_BATCH: usize = 1 << 20;
/// Optimizer steps (largest in use: Table 6: 6e5).
pub const MAX_STEPS: usize = 1 << 32;
/// Bits per string of the bit tasks (largest in use: 1000; the paper also solves XOR at n = 256).
pub const MAX_BITS: usize = 1 << 20;
/// Examples in one split of a dataset (largest in use: CIFAR-10: 50,000).
pub const MAX_EXAMPLES: usize = 1 << 28;
/// Bytes of one data file fpt reads or inflates (largest in use: CIFAR-10 batches: 30 MB).
pub const MAX_FILE_BYTES: u64 = 1 << 34;

/// Checks `value` against `max` for `what`: an error message naming both, or `Ok`.
pub fn check(what: &str, value: usize, max: usize) -> Result<(), String> {
    if value > max {
        Err(format!("{what} {value} is above fpt's limit of {max}"))
    } else {
        Ok(())
    }
}

/// Checks that `value` is at least 1 and at most `max`.
pub fn check_positive(what: &str, value: usize, max: usize) -> Result<(), String> {
    if value == 0 {
        return Err(format!("{what} must be at least 1"));
    }
    check(what, value, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_value_and_the_limit() {
        assert!(check("layers", MAX_LAYERS, MAX_LAYERS).is_ok());
        let e = check("layers", 1_000_000_000, MAX_LAYERS).unwrap_err();
        assert!(e.contains("1000000000") && e.contains("1024"), "{e}");
        assert!(check_positive("heads", 0, MAX_HEADS)
            .unwrap_err()
            .contains("at least 1"));
    }
}
