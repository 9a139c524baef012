//! What users read is written for them: no Rust debug values (`Some(..)`, `None`, struct
//! syntax) in the output of the commands they run most.

mod common;
use common::fpt;

#[test]
fn user_facing_output_has_no_rust_debug_values() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("run");
    let commands: Vec<Vec<&str>> = vec![
        vec!["inspect", "--backbone", "gpt2", "--init", "random", "--task", "bit-xor"],
        vec!["inspect", "--backbone", "lstm", "--init", "random", "--task", "listops"],
        vec!["selfcheck"],
        vec![
            "train",
            "--task",
            "bit-xor",
            "--backbone",
            "gpt2",
            "--init",
            "random",
            "--layers",
            "1",
            "--hidden",
            "16",
            "--heads",
            "2",
            "--steps",
            "4",
            "--eval-every",
            "2",
            "--out",
            run.to_str().unwrap(),
        ],
        vec!["eval", run.to_str().unwrap()],
    ];
    for args in commands {
        let out = fpt(&args);
        assert!(
            out.status.success(),
            "fpt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for debug in ["Some(", "None", "Vectors {", "Tokens {", "Ok(", "Err("] {
            assert!(!text.contains(debug), "fpt {args:?} prints `{debug}`:\n{text}");
        }
    }
}
