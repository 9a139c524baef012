//! Every run directory holds a TensorBoard event file: each step's training loss, learning
//! rate and gradient norm, and each evaluation's metrics, read back here through the
//! TFRecord framing (checksums checked) and the `Event` protobuf.

use candle_core::Device;
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};

#[test]
fn a_run_writes_its_curves_as_tensorboard_events() {
    let mut task = TaskSpec::new(TaskName::BitXor);
    task.eval_examples = 64;
    let shape = ShapeOverrides {
        layers: Some(1),
        hidden: Some(16),
        heads: Some(2),
        ..Default::default()
    };
    let spec = RunSpec {
        train: TrainSpec {
            steps: 6,
            batch_size: 8,
            micro_batch_size: 8,
            eval_every: 3,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            task,
            BackboneSpec {
                shape,
                ..BackboneSpec::new("gpt2", Init::Random)
            },
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let r = fpt_train::train(&spec, dir.path(), &Device::Cpu, &mut |_| {}).unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let events = fpt_train::tensorboard::read(&files[0]).unwrap();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let series = |tag: &str| -> Vec<(i64, f32)> {
        events
            .iter()
            .filter_map(|e| e.summary.as_ref().map(|s| (e.step, s)))
            .flat_map(|(step, s)| {
                s.value
                    .iter()
                    .filter(|v| v.tag == tag)
                    .map(move |v| (step, v.simple_value))
            })
            .collect()
    };
    let loss = series("train/loss");
    assert_eq!(loss.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3, 4, 5, 6]);
    assert!(loss.iter().all(|(_, l)| l.is_finite() && *l > 0.0));
    assert_eq!(series("train/lr").len(), 6);
    assert_eq!(series("train/grad_norm").len(), 6);
    let acc = series("test/accuracy");
    assert_eq!(acc.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3, 6]);
    assert!(
        (acc[1].1 as f64 - r.test_accuracy).abs() < 1e-6,
        "{acc:?} vs {}",
        r.test_accuracy
    );
}
