//! Helpers shared by the tests: the committed `results/` tree, a miniature table.
#![allow(dead_code)] // each test binary uses some of them

use std::path::Path;

/// Copies `from` into `to`, leaving out the top-level folders in `skip` (`runs`: the local
/// run directories, which a clean checkout does not have).
pub fn copy_tree(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if skip.contains(&name.as_str()) {
            continue;
        }
        if e.path().is_dir() {
            copy_tree(&e.path(), &to.join(&name), &[]);
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// A miniature table (`table1` at the scale `mini`: FPT and Random rows, `fpt`, `all` and
/// `medium` columns) on a 40-example custom series task and the tiny GPT-2 fixture, under
/// `dir` (`tables/`, `series.jsonl`).
pub fn write_mini(dir: &Path) {
    let tables = dir.join("tables");
    std::fs::create_dir_all(&tables).unwrap();
    let data = dir.join("series.jsonl");
    let mut lines = String::new();
    for i in 0..40 {
        let label = i % 2;
        let steps: Vec<String> = (0..6)
            .map(|t| format!("[{}]", if label == 0 { t as f64 } else { 6.0 - t as f64 } / 6.0))
            .collect();
        let split = if i < 30 { "train" } else { "test" };
        lines.push_str(&format!(
            "{{\"features\": [{}], \"label\": {label}, \"split\": \"{split}\"}}\n",
            steps.join(", ")
        ));
    }
    std::fs::write(&data, lines).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/gpt2-tiny");
    std::fs::write(
        tables.join("scales.toml"),
        format!(
            r#"
[mini]
all = {{ steps = 6, batch_size = 4, eval_every = 3 }}
[mini.backbones.gpt2]
source = "{}"
note = "the tiny test fixture stands in for GPT-2"
[mini.backbones.gpt2-medium]
source = "none"
note = "not at this scale"
"#,
            fixture.display()
        ),
    )
    .unwrap();
    std::fs::write(
        tables.join("table1.toml"),
        format!(
            r#"
id = "table1"
title = "mini"
caption = "a miniature table"
paper = [["50%", "60%", "40%"], ["70%", "80%", "124M"]]
[defaults]
task = "custom:{}"
backbone = "gpt2"
[[rows]]
label = "FPT"
init = "pretrained"
[[rows]]
label = "Random"
init = "random"
[[cols]]
label = "fpt"
train = "fpt"
[[cols]]
label = "all"
train = "all"
[[cols]]
label = "medium"
backbone = "gpt2-medium"
[[cells]]
row = "Random"
col = "medium"
metric = "params-total"
"#,
            data.display()
        ),
    )
    .unwrap();
}
