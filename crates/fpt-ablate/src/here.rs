//! What this machine holds for a table's cells: the data and weights a cell needs
//! ([`assets`], what `fpt fetch` brings), and why a cell cannot run here
//! ([`unavailable_here`]), as plans and reports say it.

#[allow(unused_imports)]
use super::*;

/// What `fpt fetch` would have to bring for `cells` to run (whether it is here or not): the
/// datasets their runs read and the pretrained models they load, as `fpt fetch` names them
/// (`minilm` for all-MiniLM-L6-v2), sorted. Cells expanded with [`expand_unchecked`](crate::expand_unchecked) name
/// what is missing here too.
pub fn assets(cells: &[Cell]) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for c in cells {
        let Plan::Run { spec, .. } = &c.plan else { continue };
        let t = spec.task.name;
        if !t.is_generated() && !matches!(t, fpt_spec::TaskName::Custom | fpt_spec::TaskName::Text) {
            out.insert(match t {
                fpt_spec::TaskName::Cifar10Lra => "cifar10".to_string(),
                t => t.to_string(),
            });
        }
        // Weights, or (a random or Bit init) a config fpt does not have built in; a local
        // directory is the user's, not fetched.
        let b = &spec.backbone;
        let needs = b.init.needs_weights() || fpt_backbones::Config::builtin(&b.source).is_none();
        if needs && !Path::new(&b.source).is_dir() {
            out.insert(if b.source == fpt_backbones::hub::MINILM_ID {
                "minilm".to_string()
            } else {
                b.source.clone()
            });
        }
    }
    out.into_iter().collect()
}

/// The status and words of a cell whose run `spec` never ran here: `unavailable`, saying
/// why, where this machine could not run it; else `pending`.
pub(crate) fn never_run(spec: &RunSpec) -> (String, Option<String>) {
    match unavailable_here(&spec.task, &spec.backbone, spec.backbone.depth) {
        Some(why) => ("unavailable".into(), Some(why)),
        None => ("pending".into(), Some("not run yet (or run by another shard)".into())),
    }
}

/// Why a cell cannot run on this machine (its data, weights or depth), if it cannot.
pub(crate) fn unavailable_here(task: &TaskSpec, backbone: &BackboneSpec, depth: Option<usize>) -> Option<String> {
    if let Err(e) = fpt_tasks::check_present(task) {
        return Some(format!("data not present: {e}"));
    }
    // A GGUF file, a directory holding one, or an installed GGUF name (`smollm2`) loads
    // from that file; anything else from a model directory or the Hub cache.
    let gguf = fpt_backbones::gguf::locate(&backbone.source).map(|found| found.map(|_| ()));
    if let Err(e) = gguf
        .and_then(|found| match found {
            Some(()) => Ok(()),
            None => fpt_backbones::hub::resolves_offline(&backbone.source, backbone.init.needs_weights()).map(|_| ()),
        })
        .or_else(|e| {
            // Random init (and Bit pretraining from it) of a built-in config (gpt2, lstm,
            // ...) needs no files.
            if !backbone.init.needs_weights() && fpt_backbones::param_specs(backbone).is_ok() {
                Ok(())
            } else {
                Err(e)
            }
        })
    {
        return Some(format!("backbone not available here: {e}"));
    }
    if let Some(d) = depth {
        match fpt_backbones::param_specs(backbone) {
            Ok((config, _)) if config.layers() < d => {
                return Some(format!(
                    "depth {d} exceeds the {} blocks of {}",
                    config.layers(),
                    backbone.source
                ))
            }
            _ => {}
        }
    }
    None
}
