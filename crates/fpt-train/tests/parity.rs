//! Training-trajectory parity with PyTorch (`tools/make_trajectory.py`): a tiny GPT-2 FPT and
//! a tiny BERT FPT (micro-batches of 2), 20 steps of Adam with clipping from the same initial
//! values and batches, on every kernel path: every loss within 1e-5 relative, every pre-clip
//! gradient norm within 1e-4 relative, every trained tensor within 1e-4 after step 20.

use candle_core::Device;
use std::path::Path;

#[test]
fn twenty_steps_follow_pytorch_on_every_kernel_path() {
    for name in ["trajectory-gpt2", "trajectory-bert"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/fixtures")
            .join(name);
        fpt_nn::kernels::on_every_path(|path| {
            let d = fpt_train::parity::replay(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!("{name} on {path}: {d:?}");
            assert_eq!(d.steps, 20);
            assert!(d.tensors >= 10, "{name}: {d:?}");
            assert!(d.loss_rel <= 1e-5, "{name} on {path}: losses {d:?}");
            assert!(d.grad_norm_rel <= 1e-4, "{name} on {path}: gradient norms {d:?}");
            assert!(d.tensor_abs <= 1e-4, "{name} on {path}: trained tensors {d:?}");
        });
    }
}
