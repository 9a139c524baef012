//! candle building blocks for training next to frozen weights, with exact and fast
//! backward passes.
//!
//! Two facts about candle 0.11 shape this crate (both measured, see the project's
//! REFERENCE notes):
//! - candle's backprop computes the gradient of *both* matmul operands, even when one is
//!   a plain tensor that nobody will update. [`ops::linear`] is a custom op whose backward
//!   computes only the gradients of arguments that take part in backprop, so a frozen
//!   weight never gets one and never appears in a `GradStore`.
//! - `candle_nn::LayerNorm` and `candle_nn::ops::softmax_last_dim` have no backward:
//!   gradients silently stop there. [`ops::layer_norm`], [`ops::masked_softmax`] and
//!   [`ops::gelu_new`] are fused CPU kernels with hand-written backward passes; on other
//!   devices they fall back to compositions of candle ops (the `*_composed` functions, also
//!   the reference the fused kernels are tested against).
//!
//! Frozen weights are plain tensors, trainable ones are `Var`s: see [`Param`].

#[cfg(feature = "cuda")]
mod cuda;
pub mod device;
#[cfg(test)]
mod host_grid;
pub mod init;
pub mod kernels;
pub mod layers;
pub mod ops;
mod param;
pub mod replay;
mod rng;
pub mod transfer;

pub use kernels::KernelPath;
pub use layers::{BranchMid, Embedding, LayerNorm, Linear, NormAt, ResidualBranch};
pub use ops::branch_node::{branch_choice, with_branch, BranchChoice};
pub use param::{grad_disabled, no_grad, Param};
pub use rng::Rng;

/// Worker threads for fpt's kernels: `RAYON_NUM_THREADS` if set, else the available
/// parallelism; read once. (candle's own `get_num_threads` re-reads `/proc/cpuinfo` on
/// every matmul unless `RAYON_NUM_THREADS` is set; the `fpt` binary sets it at start-up.)
pub fn num_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    })
}

/// Tunes glibc's allocator for training: tensors of a few MB are allocated and freed every
/// step, and by default glibc serves each with a fresh `mmap`, so every step pays for page
/// faults and zeroing (small steps spent most of their time in the kernel). Raising the
/// mmap threshold keeps that memory in the heap, and trimming is switched off: a step frees
/// its activations at the end, and with any finite threshold a large step (GPT-2 base on
/// c10 frees over 1 GB) hands the top of the heap back to the kernel, so the next step
/// faults every page in again (the measurements are in `bench/HISTORY.md`). The process
/// keeps its peak, which it reaches every step anyway.
/// Call once at start-up, before threads are spawned; a no-op off glibc.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before other threads run.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        // -1: never trim (mallopt(3)).
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

/// Hands the allocator's free memory back to the kernel (glibc's `malloc_trim(0)`, which
/// also releases free pages inside the heap). [`tune_allocator`] turns automatic trimming
/// off, so memory freed once, such as a backbone's f32 weights after they are stored in
/// bf16, would otherwise stay resident; the loader calls this after such a conversion. A
/// no-op off glibc.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the kernel; it touches no live
    // allocation and is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The environment variable candle reads for how long its element-wise workers spin
/// before parking (see [`quiet_candle_pool`]).
pub const CANDLE_SPIN_ENV: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// Makes candle's element-wise worker threads park as soon as they run out of work.
///
/// candle 0.11 splits element-wise ops over 64k elements across a pool of its own whose
/// idle workers spin 25,000 rounds before parking. The next op is usually a matrix product
/// on the rayon threads, and on a 2-core machine the spinning worker takes one of their two
/// cores (the measured effect is in `bench/HISTORY.md`). A value the user set is kept. Call
/// once at start-up, before any thread is
/// spawned (it sets an environment variable; the `fpt` binary does).
pub fn quiet_candle_pool() {
    if std::env::var_os(CANDLE_SPIN_ENV).is_none() {
        std::env::set_var(CANDLE_SPIN_ENV, "0");
    }
}

/// The stack of each [`pool`] worker: 256 MiB of address space, touched only as deep as a
/// graph goes. candle walks (and drops) the autograd graph recursively, and an unfused
/// recurrence nests it tens of thousands of nodes deep: the LSTM's composed twin, which a
/// GPU runs, at three layers of 512 steps overflowed rayon's default 2 MiB stacks on an
/// H200 (2026-11-26; `tests/blocks.rs` runs that depth here).
pub const WORKER_STACK_BYTES: usize = 256 << 20;

/// fpt's rayon pool, where [`on_pool`] runs every training step and evaluation: one worker
/// per [`num_threads`], each with a [`WORKER_STACK_BYTES`] stack. Its own pool rather than
/// rayon's global one, which whatever runs first (a candle op, a test) may have built with
/// other stacks. Built at the first call; `None` where the OS refused the threads (then
/// [`on_pool`] runs in place, and says so once).
pub fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(num_threads())
            .stack_size(WORKER_STACK_BYTES)
            .thread_name(|i| format!("fpt-worker-{i}"))
            .build()
            .map_err(|e| {
                eprintln!(
                    "warning: fpt cannot start {} worker threads ({e}); steps run on the calling thread",
                    num_threads()
                )
            })
            .ok()
    })
    .as_ref()
}

/// Runs `f` on a worker thread of fpt's [`pool`] (in place when already on a rayon worker)
/// and returns what it returns; a panic in `f` propagates.
///
/// fpt's CPU kernels split their work with rayon. Called from a thread outside the pool,
/// every split hands a job to the pool and puts the caller to sleep until it is done: two
/// cross-thread wake-ups per kernel, and a step of a small model runs hundreds of kernels.
/// Called from a pool worker, a split is a `join`: the caller starts on its half at once
/// and the other worker steals the rest, which makes small models' steps measurably faster
/// (`bench/HISTORY.md`, "Steps on a pool worker"). `fpt_train::Trainer` runs each step and
/// evaluation through it.
///
/// What this thread set for itself goes along: [`no_grad`], [`kernels::with_path`],
/// [`with_branch`] and [`replay::with_upload_cache`] hold inside `f` as they do here.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let Some(pool) = pool().filter(|_| rayon::current_thread_index().is_none()) else {
        return f();
    };
    let path = kernels::overridden();
    let detached = grad_disabled();
    let branch = ops::branch_node::overridden();
    let cached = replay::upload_cache_device();
    pool.install(move || {
        let run = || {
            kernels::with_override(path, || {
                param::with_grad_disabled(detached, || ops::branch_node::with_branch(branch, f))
            })
        };
        match &cached {
            Some(device) => replay::with_upload_cache(device, run),
            None => run(),
        }
    })
}

/// Forward-pass context: training mode (dropout on) and the random stream dropout draws
/// from. One `Ctx` per run keeps dropout masks reproducible from the seed.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Dropout is applied only when `train` is true.
    pub train: bool,
    /// The stream dropout masks are drawn from.
    pub rng: Rng,
    /// When `Some`, every attention layer appends its probabilities `[batch, heads,
    /// queries, keys]` (detached), in layer order: what the attention-map figures draw.
    pub attention: Option<Vec<candle_core::Tensor>>,
}

impl Ctx {
    /// A training context seeded with `seed`.
    pub fn train(seed: u64) -> Self {
        Self {
            train: true,
            rng: Rng::new(seed),
            attention: None,
        }
    }

    /// An evaluation context (no dropout).
    pub fn eval() -> Self {
        Self {
            train: false,
            rng: Rng::new(0),
            attention: None,
        }
    }

    /// Inverted dropout with probability `p` when training; identity otherwise.
    pub fn dropout(&mut self, x: &candle_core::Tensor, p: f64) -> candle_core::Result<candle_core::Tensor> {
        if !self.train || p <= 0.0 {
            return Ok(x.clone());
        }
        ops::dropout(x, p, &mut self.rng)
    }

    /// `x + dropout(y)` (a residual branch) with probability `p` when training, `x + y`
    /// otherwise; fused on CPU (the mask is redrawn in backward, not stored).
    pub fn dropout_add(
        &mut self,
        x: &candle_core::Tensor,
        y: &candle_core::Tensor,
        p: f64,
    ) -> candle_core::Result<candle_core::Tensor> {
        if !self.train || p <= 0.0 {
            return x + y;
        }
        ops::dropout_add(x, y, p, self.rng.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `on_pool` runs its closure on a pool worker (when there is more than one thread),
    /// carries this thread's `no_grad` and kernel path along, runs nested calls in place,
    /// and hands back the closure's value and its panic.
    #[test]
    fn on_pool_runs_on_a_worker_with_this_threads_settings() {
        assert_eq!(
            rayon::current_thread_index(),
            None,
            "the test harness thread is not a worker"
        );
        let (worker, nested_same_thread) = on_pool(|| {
            let me = std::thread::current().id();
            (
                rayon::current_thread_index(),
                on_pool(|| std::thread::current().id()) == me,
            )
        });
        assert!(worker.is_some(), "the step ran on a pool worker");
        assert!(nested_same_thread);
        assert!(!on_pool(grad_disabled));
        assert!(no_grad(|| on_pool(grad_disabled)));
        assert!(!grad_disabled());
        let outer = KernelPath::active();
        let inside = kernels::with_path(KernelPath::Portable, || on_pool(KernelPath::active)).unwrap();
        assert_eq!(inside, KernelPath::Portable);
        assert_eq!(on_pool(KernelPath::active), outer);
        let r = std::panic::catch_unwind(|| on_pool(|| -> u8 { panic!("boom") }));
        assert!(r.is_err());
        // The worker's settings are back to its own after the panic.
        assert_eq!(on_pool(KernelPath::active), outer);
        assert!(!on_pool(grad_disabled));
    }

    /// A worker that picks a job up while inside somebody else's `no_grad` (here: every
    /// worker, waiting in `no_grad` and running whatever is pending) runs it with the
    /// caller's flag, not its own: a training step handed over while an evaluation waits
    /// must record its graph.
    #[test]
    fn on_pool_jobs_get_the_callers_flag_not_the_workers() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        if num_threads() <= 1 {
            return;
        }
        let (inside, done) = (AtomicUsize::new(0), AtomicBool::new(false));
        let pool = pool().expect("the pool starts");
        let workers = pool.current_num_threads();
        std::thread::scope(|s| {
            let caller = s.spawn(|| {
                while inside.load(Ordering::Acquire) < workers {
                    std::thread::yield_now();
                }
                let seen = on_pool(|| (rayon::current_thread_index(), grad_disabled()));
                done.store(true, Ordering::Release);
                seen
            });
            pool.broadcast(|_| {
                no_grad(|| {
                    inside.fetch_add(1, Ordering::AcqRel);
                    while !done.load(Ordering::Acquire) {
                        rayon::yield_now();
                    }
                })
            });
            let (worker, disabled) = caller.join().unwrap();
            assert!(worker.is_some(), "the job ran on a worker");
            assert!(!disabled, "the job inherited the worker's no_grad");
        });
    }
}
