//! Which CPU kernels run: the one switch every dispatching op reads.
//!
//! fpt's CPU ops have up to three implementations, chosen at run time:
//! - [`KernelPath::Avx512Bf16`]: everything of the AVX-512 path, plus the AVX512_BF16
//!   micro-kernel (`vdpbf16ps`, `ops/bf16.rs`) for products with frozen bf16 weights
//!   (`precision: bf16`); on every other path those products round their activation operand to
//!   bf16, widen the weight to f32 and run that path's f32 product (the same numbers up to
//!   the order of the f32 sums);
//! - [`KernelPath::Avx512`]: fpt's own matrix product with its AVX-512 micro-kernel
//!   (`ops/sgemm.rs`), frozen weights kept packed for it, the fused pre-norm branch, and the
//!   AVX2 + FMA element-wise loops below;
//! - [`KernelPath::Avx2`]: the same product with an AVX2 + FMA micro-kernel, packed frozen
//!   weights, the fused branch, and the AVX2 + FMA element-wise loops (`ops/fastmath.rs`:
//!   GELUs, softmax rows, dropout masks);
//! - [`KernelPath::Portable`]: the `gemm` crate's product and plain Rust element-wise loops,
//!   what every CPU without AVX2 (ARM included) runs.
//!
//! The path is the best one the CPU supports ([`KernelPath::detected`]), lowered by the
//! environment variable `FPT_KERNELS` (`portable`, `avx2`, `avx512` or `avx512bf16`: the most capable
//! path allowed; `auto` or unset: no limit) and, on one thread, by [`with_path`], so the
//! tests run every path the CPU supports and CI runs the whole suite a second time on the
//! portable path. Each op reads [`KernelPath::active`] once on the calling thread and hands
//! the value to its kernels (which may run on other threads).
//!
//! `FPT_TEST_FAULT=drop-bias` is a test-only switch: the f32 matrix product then ignores
//! its bias on every path, so `fpt selfcheck` can be shown to fail.

use std::cell::Cell;
use std::sync::OnceLock;

/// One of the CPU kernel sets (ordered from least to most capable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelPath {
    /// Plain Rust loops and the `gemm` crate's product: every CPU.
    Portable,
    /// AVX2 + FMA element-wise loops, fpt's matrix product with an AVX2 micro-kernel,
    /// packed frozen weights and the fused branch.
    Avx2,
    /// The same with fpt's AVX-512 micro-kernel.
    Avx512,
    /// The AVX-512 path plus the AVX512_BF16 micro-kernel for products with bf16 weights.
    Avx512Bf16,
}

/// A bad `FPT_KERNELS` value or a path this CPU cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The value is not a path name.
    #[error("FPT_KERNELS={0:?}: expected one of portable, avx2, avx512, avx512bf16 or auto")]
    BadName(String),
    /// The CPU lacks the instructions the path needs.
    #[error("the {wanted} kernels cannot run on this CPU ({cpu}); the best it runs is {best}")]
    Unsupported {
        /// The path asked for.
        wanted: &'static str,
        /// The best path this CPU runs.
        best: &'static str,
        /// The CPU's model name.
        cpu: String,
    },
}

/// The environment variable that limits the kernel path.
pub const ENV: &str = "FPT_KERNELS";

impl KernelPath {
    /// Every path, least capable first.
    pub const ALL: [KernelPath; 4] = [
        KernelPath::Portable,
        KernelPath::Avx2,
        KernelPath::Avx512,
        KernelPath::Avx512Bf16,
    ];

    /// The path's name as `FPT_KERNELS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Portable => "portable",
            KernelPath::Avx2 => "avx2",
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx512Bf16 => "avx512bf16",
        }
    }

    /// Parses a name (`portable`, `avx2`, `avx512`, `avx512bf16`); `auto` and the empty
    /// string mean no limit (`None`).
    pub fn parse(s: &str) -> Result<Option<Self>, KernelError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "portable" => Ok(Some(KernelPath::Portable)),
            "avx2" => Ok(Some(KernelPath::Avx2)),
            "avx512" => Ok(Some(KernelPath::Avx512)),
            "avx512bf16" | "avx512_bf16" | "avx512-bf16" => Ok(Some(KernelPath::Avx512Bf16)),
            _ => Err(KernelError::BadName(s.to_string())),
        }
    }

    /// The most capable path this CPU runs (read once).
    pub fn detected() -> Self {
        static DETECTED: OnceLock<KernelPath> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
                if avx2 && std::is_x86_feature_detected!("avx512f") {
                    if std::is_x86_feature_detected!("avx512bf16") {
                        return KernelPath::Avx512Bf16;
                    }
                    return KernelPath::Avx512;
                }
                if avx2 {
                    return KernelPath::Avx2;
                }
            }
            KernelPath::Portable
        })
    }

    /// Whether this CPU has the instructions the path needs.
    pub fn runs_here(self) -> bool {
        self <= Self::detected()
    }

    /// The path ops use by default in this process: the detected one, lowered to
    /// `FPT_KERNELS` when that is set (read once).
    ///
    /// # Panics
    /// If `FPT_KERNELS` holds something other than a path name; binaries check it first
    /// with [`ceiling_from_env`] and report it as an error.
    pub fn process_default() -> Self {
        static DEFAULT: OnceLock<KernelPath> = OnceLock::new();
        *DEFAULT.get_or_init(|| match ceiling_from_env() {
            Ok(Some(c)) => c.min(Self::detected()),
            Ok(None) => Self::detected(),
            Err(e) => panic!("{e}"),
        })
    }

    /// The path an op called on this thread uses now: [`with_path`]'s, else
    /// [`KernelPath::process_default`].
    pub fn active() -> Self {
        OVERRIDE.with(|o| o.get()).unwrap_or_else(Self::process_default)
    }

    /// Every path that runs here and is allowed by `FPT_KERNELS`, least capable first: what
    /// the kernel tests loop over.
    pub fn available() -> Vec<Self> {
        let top = Self::process_default();
        Self::ALL.into_iter().filter(|p| *p <= top).collect()
    }

    /// Whether the AVX2 + FMA element-wise loops run on this path.
    #[inline]
    pub(crate) fn avx2(self) -> bool {
        self >= KernelPath::Avx2
    }

    /// Whether fpt's own blocked matrix product (its AVX2 or AVX-512 micro-kernel), the
    /// packed frozen weights and the fused branch run on this path.
    #[inline]
    pub(crate) fn own_gemm(self) -> bool {
        self >= KernelPath::Avx2
    }

    /// Whether fpt's AVX-512 micro-kernel runs on this path.
    #[inline]
    pub(crate) fn avx512(self) -> bool {
        self >= KernelPath::Avx512
    }

    /// Whether the AVX512_BF16 micro-kernel multiplies by bf16 weights on this path.
    #[inline]
    pub fn bf16(self) -> bool {
        self == KernelPath::Avx512Bf16
    }

    /// How products with bf16 weights run on this path, for reports: the native bf16
    /// micro-kernel, or rounding the activations to bf16 and multiplying in f32.
    pub fn bf16_kernel(self) -> &'static str {
        if self.bf16() {
            "vdpbf16ps (AVX512_BF16)"
        } else {
            "bf16 operands widened to f32"
        }
    }
}

impl std::fmt::Display for KernelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `FPT_KERNELS` as set in the environment: `Ok(None)` when unset or `auto`.
pub fn ceiling_from_env() -> Result<Option<KernelPath>, KernelError> {
    match std::env::var(ENV) {
        Ok(v) => KernelPath::parse(&v),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(KernelError::BadName(v.to_string_lossy().into_owned())),
    }
}

thread_local! {
    static OVERRIDE: Cell<Option<KernelPath>> = const { Cell::new(None) };
}

/// Runs `f` with every op called on this thread using `path` (ops hand the path to the
/// threads they start). Nests; the previous path is restored when `f` returns or panics.
pub fn with_path<R>(path: KernelPath, f: impl FnOnce() -> R) -> Result<R, KernelError> {
    if !path.runs_here() {
        return Err(KernelError::Unsupported {
            wanted: path.name(),
            best: KernelPath::detected().name(),
            cpu: cpu_model(),
        });
    }
    Ok(with_override(Some(path), f))
}

/// The path [`with_path`] set on this thread, if any.
pub(crate) fn overridden() -> Option<KernelPath> {
    OVERRIDE.with(|o| o.get())
}

/// Runs `f` with this thread's override set to `path` (one [`overridden`] read on another
/// thread, so already checked by [`with_path`]), restoring the previous one after.
pub(crate) fn with_override<R>(path: Option<KernelPath>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<KernelPath>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDE.with(|o| o.replace(path)));
    f()
}

/// Runs `f` on every path in [`KernelPath::available`], each under [`with_path`], and
/// collects the results; the path is printed to stderr before each run, so a test that
/// fails (or panics) on one path names it.
pub fn on_every_path<R>(mut f: impl FnMut(KernelPath) -> R) -> Vec<R> {
    KernelPath::available()
        .into_iter()
        .map(|path| {
            eprintln!("-- on the {path} kernel path");
            with_path(path, || f(path)).expect("available paths run here")
        })
        .collect()
}

/// The CPU's model name (`/proc/cpuinfo` on Linux; the architecture elsewhere).
pub fn cpu_model() -> String {
    static MODEL: OnceLock<String> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                        .and_then(|l| l.split_once(':'))
                        .map(|(_, v)| v.trim().to_string())
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| std::env::consts::ARCH.to_string())
        })
        .clone()
}

/// The test-only fault `FPT_TEST_FAULT=drop-bias`: the f32 product ignores its bias.
pub(crate) fn fault_drop_bias() -> bool {
    static FAULT: OnceLock<bool> = OnceLock::new();
    *FAULT.get_or_init(|| std::env::var("FPT_TEST_FAULT").is_ok_and(|v| v.trim() == "drop-bias"))
}

/// The faults switched on in this process (for reports): empty normally.
pub fn active_faults() -> Vec<&'static str> {
    if fault_drop_bias() {
        vec!["drop-bias"]
    } else {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_overrides_nest_and_restore() {
        for p in KernelPath::ALL {
            assert_eq!(KernelPath::parse(p.name()), Ok(Some(p)));
        }
        assert_eq!(KernelPath::parse(" AVX2 "), Ok(Some(KernelPath::Avx2)));
        assert_eq!(KernelPath::parse("auto"), Ok(None));
        assert!(matches!(KernelPath::parse("avx-512"), Err(KernelError::BadName(_))));
        let outer = KernelPath::active();
        with_path(KernelPath::Portable, || {
            assert_eq!(KernelPath::active(), KernelPath::Portable);
            if KernelPath::Avx2.runs_here() {
                with_path(KernelPath::Avx2, || assert_eq!(KernelPath::active(), KernelPath::Avx2)).unwrap();
            }
            assert_eq!(KernelPath::active(), KernelPath::Portable);
        })
        .unwrap();
        assert_eq!(KernelPath::active(), outer);
        // A panic inside restores the path too.
        let r = std::panic::catch_unwind(|| with_path(KernelPath::Portable, || panic!("boom")));
        assert!(r.is_err());
        assert_eq!(KernelPath::active(), outer);
        // A path the CPU lacks is refused, naming it.
        if !KernelPath::Avx512.runs_here() {
            let e = with_path(KernelPath::Avx512, || ()).unwrap_err();
            assert!(e.to_string().contains("avx512"), "{e}");
        }
        assert!(KernelPath::available().contains(&KernelPath::Portable));
        assert!(KernelPath::available().iter().all(|p| p.runs_here()));
    }
}
