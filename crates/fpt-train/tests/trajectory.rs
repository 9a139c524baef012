//! Training-trajectory parity with PyTorch (`tools/make_trajectory.py`): a tiny GPT-2 FPT and
//! a tiny BERT FPT (micro-batches of 2), 20 steps of Adam with clipping from the same initial
//! values and batches, on every kernel path: every loss within 1e-5 relative, every pre-clip
//! gradient norm within 1e-4 relative, every trained tensor within 1e-4 after step 20.

use std::path::Path;

#[test]
fn twenty_steps_follow_pytorch_on_every_kernel_path() {
    // FPT_DEVICE=cuda:0 runs the same replay on a GPU (a `--features cuda` build).
    let device = fpt_nn::device::from_env().unwrap();
    for name in ["trajectory-gpt2", "trajectory-bert"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/fixtures")
            .join(name);
        fpt_nn::kernels::on_every_path(|path| {
            let d = fpt_train::trajectory::replay(&dir, &device).unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!("{name} on {path}: {d:?}");
            assert_eq!(d.steps, 20);
            assert!(d.tensors >= 10, "{name}: {d:?}");
            // On a GPU (cuBLAS's own summation order) the bound is 1e-3.
            let (loss, rest) = if device.is_cpu() { (1e-5, 1e-4) } else { (1e-3, 1e-3) };
            assert!(d.loss_rel <= loss, "{name} on {path}: losses {d:?}");
            assert!(d.grad_norm_rel <= rest, "{name} on {path}: gradient norms {d:?}");
            assert!(d.tensor_abs <= rest, "{name} on {path}: trained tensors {d:?}");
        });
    }
}
