//! Where fpt's data lives on disk: the cache home and each task's data directory. Below
//! both the fetchers (`fetch`) and the dataset readers, which only need to know where to
//! look.

use fpt_spec::TaskName;
use std::path::PathBuf;

/// `$FPT_HOME`, or `~/.cache/fpt`.
pub fn home() -> PathBuf {
    if let Some(h) = std::env::var_os("FPT_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("fpt")
}

/// Where a task's data lives: `$FPT_HOME/data/<name>` (CIFAR-10 LRA shares CIFAR-10's).
pub fn data_dir(task: TaskName) -> PathBuf {
    let name = match task {
        TaskName::Cifar10Lra => TaskName::Cifar10,
        t => t,
    };
    home().join("data").join(name.as_str())
}
