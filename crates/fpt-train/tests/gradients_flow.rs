//! Every trained tensor of a small random model of each backbone family gets a finite,
//! nonzero gradient from one micro-batch, on every CPU kernel path this machine runs (the
//! GPU's path is checked on the device by `fpt gpu-check`, with the same function). An op
//! without a backward would leave the tensors below it with none.

use candle_core::Device;
use fpt_nn::kernels::{with_path, KernelPath};

#[test]
fn every_trained_tensor_gets_a_gradient_on_every_kernel_path() {
    let mut paths = 0;
    for path in KernelPath::ALL.into_iter().filter(|p| p.runs_here()) {
        let checks = with_path(path, || fpt_train::device_check::gradients_flow(&Device::Cpu))
            .unwrap()
            .unwrap();
        assert_eq!(checks.len(), 5, "{path}: every family checked");
        for c in checks {
            assert!(c.trained >= 10, "{path} {}: {} trained tensors", c.backbone, c.trained);
            assert!(c.passed, "{path} {}: no gradient for {:?}", c.backbone, c.missing);
        }
        paths += 1;
    }
    assert!(paths >= 1);
}
