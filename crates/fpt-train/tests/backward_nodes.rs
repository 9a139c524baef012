//! The step as a GPU runs it, counted and checked on the CPU. Per step, how many gradients
//! candle's backward starts from a zero tensor and adds into
//! (one for every node of the graph but the trained tensors): with each frozen block half
//! one node of the graph (what a GPU runs, `FPT_BRANCH=node`), four fewer per residual
//! branch than with the branch composed of the layers' ops (`FPT_BRANCH=composed`), so the
//! whole step saves four per branch the model runs. Counted on the CPU (the node's forward
//! is the composed ops', the same graph a GPU builds around it); the counts are printed
//! (`--nocapture`).

use candle_core::Device;
use fpt_nn::{with_branch, BranchChoice};
use fpt_spec::{BackboneSpec, Init, RunSpec, ShapeOverrides, TaskName, TaskSpec, TrainSpec};
use fpt_train::Trainer;

fn nodes(source: &str, layers: usize, task: TaskName, choice: BranchChoice) -> usize {
    let spec = RunSpec {
        train: TrainSpec {
            steps: 1,
            batch_size: 4,
            micro_batch_size: 4,
            seed: 0,
            ..TrainSpec::default()
        },
        ..RunSpec::new(
            TaskSpec::new(task),
            BackboneSpec {
                shape: ShapeOverrides {
                    layers: Some(layers),
                    hidden: Some(32),
                    heads: Some(2),
                    ..Default::default()
                },
                ..BackboneSpec::new(source, Init::Random)
            },
        )
    };
    let mut tr = Trainer::new(&spec, &Device::Cpu).unwrap();
    with_branch(Some(choice), || tr.backward_nodes()).unwrap()
}

#[test]
fn a_branch_node_saves_four_zero_and_add_gradients_per_branch_a_step() {
    // Bit XOR reads out the last token: the last block's attention half runs its queries
    // for that position only (no branch there), its feed-forward half is a branch.
    for source in ["gpt2", "minilm"] {
        for layers in [1, 6] {
            let composed = nodes(source, layers, TaskName::BitXor, BranchChoice::Composed);
            let node = nodes(source, layers, TaskName::BitXor, BranchChoice::Node);
            let branches = 2 * layers - 1;
            println!("{source}, {layers} blocks, bit-xor: composed {composed} nodes, branch nodes {node}");
            assert_eq!(
                composed - node,
                4 * branches,
                "{source}, {layers} blocks: {composed} vs {node}"
            );
        }
    }
}
