//! `fpt inspect`: a backbone's config, parameter counts per group, and the task data.

use crate::args::{BackboneArgs, TaskArgs};
use anyhow::Result;
use candle_core::Device;
use clap::Args;
use fpt_spec::{Role, TaskName, TaskSpec};

#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub(crate) backbone: BackboneArgs,
    /// Count the input and output layers of this task too; for a dataset that is present,
    /// report its splits, label distribution, sequence lengths and batch loading time.
    #[command(flatten)]
    pub(crate) task: TaskArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// Splits, label counts, lengths and batch loading time of a dataset task that is present.
pub(crate) fn data_report(spec: &TaskSpec) -> Result<Option<serde_json::Value>> {
    if spec.name.is_generated() {
        return Ok(None);
    }
    let t0 = std::time::Instant::now();
    let mut task = match fpt_tasks::build(spec, &fpt_nn::Rng::new(0)) {
        Ok(t) => t,
        Err(fpt_tasks::TaskError::Missing { .. }) if spec.name != TaskName::Custom => {
            let e = fpt_tasks::build(spec, &fpt_nn::Rng::new(0))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Ok(Some(serde_json::json!({ "present": false, "why": e })));
        }
        Err(e) => return Err(e.into()),
    };
    let load_s = t0.elapsed().as_secs_f64();
    let classes = task.dims().classes;
    let splits: Vec<fpt_tasks::data::SplitSummary> = task
        .splits()
        .iter()
        .map(|(n, d)| fpt_tasks::data::summarize(n, d, classes))
        .collect();
    // Batch loading time: 16 examples (the c10 bench batch), median of 20 after 3 warm-up.
    let mut rng = fpt_nn::Rng::new(0);
    let mut times = Vec::new();
    for i in 0..23 {
        let t = std::time::Instant::now();
        task.train_batch(16, &mut rng, &Device::Cpu)?;
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(Some(serde_json::json!({
        "present": true,
        "load_seconds": load_s,
        "batch16_ms_median": times[times.len() / 2],
        "batch16_ms_max": times[times.len() - 1],
        "splits": splits,
    })))
}

pub(crate) fn print_data_report(r: &serde_json::Value) {
    if r["present"] == false {
        println!("data       not present: {}", r["why"].as_str().unwrap_or(""));
        return;
    }
    println!(
        "data       loaded in {:.1} s; a training batch of 16 takes {:.2} ms (median of 20; max {:.2})",
        r["load_seconds"].as_f64().unwrap_or(0.0),
        r["batch16_ms_median"].as_f64().unwrap_or(0.0),
        r["batch16_ms_max"].as_f64().unwrap_or(0.0)
    );
    for s in r["splits"].as_array().into_iter().flatten() {
        let counts: Vec<String> = s["label_counts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c.to_string())
            .collect();
        let shown = if counts.len() > 20 {
            format!(
                "{} classes, {} non-empty",
                counts.len(),
                counts.iter().filter(|c| *c != "0").count()
            )
        } else {
            counts.join(" ")
        };
        println!(
            "split      {:<6} {:>7} examples; labels: {shown}",
            s["split"].as_str().unwrap_or(""),
            s["examples"]
        );
        if let Some(l) = s["lengths"].as_object() {
            println!(
                "           lengths (tokens before the cut): min {} median {} mean {:.1} max {}; {} cut",
                l["min"],
                l["median"],
                l["mean"].as_f64().unwrap_or(0.0),
                l["max"],
                l["cut"]
            );
            let bucket = l["bucket"].as_u64().unwrap_or(1);
            let hist: Vec<String> = l["histogram"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| format!("{}-{}: {}", h[0], h[0].as_u64().unwrap_or(0) + bucket - 1, h[1]))
                .collect();
            println!("           histogram: {}", hist.join(", "));
        }
    }
}

pub(crate) fn inspect(a: InspectArgs) -> Result<()> {
    let bspec = a.backbone.spec();
    let (config, specs) = fpt_backbones::param_specs(&bspec)?;
    let groups = a.backbone.train_groups;
    let hidden = config.hidden_size();
    let tspec = a.task.spec();
    let data = match &tspec {
        Some(t) => data_report(t)?,
        None => None,
    };
    let dims = match &tspec {
        Some(t) => match fpt_tasks::dims_of(t) {
            Some(d) => Some(d),
            None => Some(fpt_tasks::build(t, &fpt_nn::Rng::new(0))?.dims()),
        },
        None => None,
    };
    // Without a task, count the backbone alone.
    let backbone = fpt_model::count_backbone(&specs, &groups);
    let counts = match &dims {
        Some(d) => fpt_model::count_params(&specs, hidden, d, &groups),
        None => backbone.clone(),
    };
    let (backbone_trainable, backbone_total) = (backbone.trainable, backbone.total);
    if a.json {
        let by_role: serde_json::Map<String, serde_json::Value> = counts
            .by_role
            .iter()
            .map(|(r, (t, tr))| (r.to_string(), serde_json::json!({"total": t, "trainable": tr})))
            .collect();
        let v = serde_json::json!({
            "backbone": bspec.source,
            "architecture": config.architecture(),
            "init": bspec.init.to_string(),
            "config": config.to_json(),
            "task": tspec.as_ref().map(|t| t.label()),
            "task_dims": dims,
            "data": data,
            "train_groups": groups.to_string(),
            "backbone_total": backbone_total,
            "backbone_trainable": backbone_trainable,
            "total": counts.total,
            "trainable": counts.trainable,
            "by_role": by_role,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "backbone   {} ({}, init {})",
        bspec.source,
        config.architecture(),
        bspec.init
    );
    println!("config     {}", config.summary());
    if let (Some(t), Some(d)) = (&tspec, &dims) {
        println!(
            "task       {}: {} tokens of {}, read-out from the last {}, {} labels x {} classes",
            t.label(),
            d.seq_len,
            match d.input {
                fpt_tasks::InputKind::Vectors { width } => format!("{width} values"),
                fpt_tasks::InputKind::Tokens { vocab } => format!("ids below {vocab}"),
            },
            d.readout_tokens,
            d.labels_per_example,
            d.classes
        );
    }
    if let Some(r) = &data {
        print_data_report(r);
    }
    println!("train      {groups}");
    println!("{:<14}{:>14}{:>14}", "group", "total", "trainable");
    for r in Role::ALL {
        if let Some((t, tr)) = counts.by_role.get(&r) {
            println!("{:<14}{:>14}{:>14}", r.to_string(), t, tr);
        }
    }
    println!("{:<14}{:>14}{:>14}", "all", counts.total, counts.trainable);
    println!("backbone     {backbone_total:>14}{backbone_trainable:>14}");
    println!("(`other`: token tables such as GPT-2's wte and BERT's word embeddings, pooler: counted, unused with input embeddings, never trained)");
    Ok(())
}
