//! `fpt report` and `fpt plot` on a fixture results tree (`data/fixtures/site`: Table 2's
//! report and Figures 1 and 3 at the `cpu` scale as fpt wrote them, with the records of
//! Table 2's runs): every number of the reports' JSON is in the HTML, beside the paper's; each
//! run page shows its result; nothing is fetched from a network; and, where Chromium is
//! installed (required with `FPT_REQUIRE_CHROMIUM=1`, as `.ci/run` sets), the site opens in
//! headless Chromium without script errors, with screenshots in `target/site-screenshots/`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fpt"))
        .args(args)
        .env("FPT_LOG", "error")
        .output()
        .expect("run fpt")
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fixtures/site")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The fixture tree copied to a temporary directory and its site written.
fn built_site() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let results = tmp.path().join("results");
    copy_tree(&fixture(), &results);
    let out = fpt(&["report", results.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "fpt report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (tmp, results)
}

fn reports(results: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(results.join("table2/cpu/report.json")).unwrap();
    vec![serde_json::from_str(&text).unwrap()]
}

/// The value of attribute `name` in the tag that starts at `tag`.
fn attr_in(tag: &str, name: &str) -> Option<String> {
    let end = tag.find('>')?;
    let tag = &tag[..end];
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(tag[start..start + len].to_string())
}

fn html_esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[test]
fn the_site_shows_every_number_of_the_reports_beside_the_papers() {
    let (_tmp, results) = built_site();
    let index = std::fs::read_to_string(results.join("index.html")).unwrap();
    let mut cited = 0;
    for r in reports(&results) {
        let (id, scale) = (r["id"].as_str().unwrap(), r["scale"].as_str().unwrap());
        assert!(
            index.contains(&format!("data-report=\"{id}-{scale}\"")),
            "index lists {id} at {scale}"
        );
        let page = std::fs::read_to_string(results.join(format!("site/{id}-{scale}.html"))).unwrap();
        let cells = r["cells"].as_array().unwrap();
        assert!(!cells.is_empty());
        for c in cells {
            let (row, col) = (c["row"].as_str().unwrap(), c["col"].as_str().unwrap());
            let key = format!("data-row=\"{}\" data-col=\"{}\"", html_esc(row), html_esc(col));
            let at = page
                .find(&key)
                .unwrap_or_else(|| panic!("{id}: no grid cell for {row} / {col}"));
            // The tag that holds the cell's attributes starts before `key`.
            let tag = &page[page[..at].rfind('<').unwrap()..];
            let num = |name: &str| attr_in(tag, name).map(|v| v.parse::<f64>().unwrap());
            assert_eq!(num("data-ours"), c["ours"].as_f64(), "{id}: ours at {row} / {col}");
            assert_eq!(num("data-paper"), c["paper"].as_f64(), "{id}: paper at {row} / {col}");
            let shown = &tag[tag.find("<span class=\"ours\">").unwrap() + 19..];
            let shown = &shown[..shown.find('<').unwrap()];
            let paper_text = html_esc(c["paper_text"].as_str().unwrap());
            assert!(
                tag[..tag.find("</td>").unwrap()].contains(&format!("({paper_text})")),
                "{id}: the paper's {paper_text} beside ours at {row} / {col}"
            );
            match c["ours"].as_f64() {
                Some(v) if c["metric"] == "test-accuracy" => assert_eq!(shown, format!("{v:.1}%")),
                Some(_) => assert!(!shown.is_empty()),
                None => assert_eq!(shown, c["status"].as_str().unwrap(), "{id}: status shown"),
            }
            // A cell with a run links its run page, which shows the run's own result.
            if let Some(run) = c["run"].as_str() {
                let key = run.trim_start_matches("runs/");
                let run_page = results.join(format!("site/run-{key}.html"));
                let text = std::fs::read_to_string(&run_page)
                    .unwrap_or_else(|_| panic!("{id}: no page for the run {key} of {row} / {col}"));
                let record: Value = serde_json::from_str(
                    &std::fs::read_to_string(results.join(format!("records/{key}.json"))).unwrap(),
                )
                .unwrap();
                let acc = record["result"]["test_accuracy"].as_f64().unwrap();
                assert!(
                    text.contains(&format!("<td data-field=\"test accuracy\">{:.2}%</td>", 100.0 * acc)),
                    "run {key}: test accuracy shown"
                );
                assert!(
                    tag.contains(&format!("href=\"run-{key}.html\"")),
                    "{id}: the cell links its run"
                );
                assert!(
                    tag.contains("<svg class=\"spark\""),
                    "{id}: a sparkline in {row} / {col}"
                );
                let evals = record["evals"].as_array().unwrap().len();
                // Each curve point is drawn: one circle per evaluation on the accuracy plot.
                let plot = &text[text.find("held-out accuracy (%) by step").unwrap()..];
                let plot = &plot[..plot.find("</svg>").unwrap()];
                assert_eq!(
                    plot.matches("<circle").count(),
                    evals,
                    "run {key}: every evaluation plotted"
                );
                cited += 1;
            }
        }
        for claim in r["claims"].as_array().unwrap() {
            let text = html_esc(claim["text"].as_str().unwrap());
            assert!(page.contains(&text), "{id}: claim {text}");
            assert!(index.contains(&text), "index: claim {text}");
            let verdict = claim["ours"]["verdict"].as_str().unwrap();
            assert!(page.contains(&format!(">{verdict}</span>")), "{id}: verdict {verdict}");
        }
    }
    assert!(cited >= 10, "the fixture's Table 2 cites its runs ({cited})");
    // Figures: listed, their page shows the figure inline and what the markdown says;
    // Figure 3's page links the run it was drawn from.
    for (id, quote) in [
        (
            "fig1",
            "Figure 1: frozen pretrained transformer vs fully trained transformer",
        ),
        ("fig3", "Figure 3: on Bit XOR, FPT learns to attend positionally"),
    ] {
        assert!(index.contains(&format!("data-report=\"{id}-cpu\"")), "index lists {id}");
        let page = std::fs::read_to_string(results.join(format!("site/{id}-cpu.html"))).unwrap();
        assert!(page.contains(quote), "{id}: its caption");
        assert!(page.contains("<div class=\"figure\"><svg"), "{id}: the figure inline");
    }
    let fig3 = std::fs::read_to_string(results.join("site/fig3-cpu.html")).unwrap();
    assert!(
        fig3.contains("href=\"run-342566c03ca2dcfe.html\""),
        "fig3 links its run"
    );
    assert!(fig3.contains("<td>0.635</td>"), "fig3's table of attention mass");
    // Self-contained: nothing is loaded from elsewhere.
    for e in std::fs::read_dir(results.join("site")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for bad in ["src=\"http", "href=\"http", "@import", "url(http"] {
            assert!(!text.contains(bad), "a page loads {bad}");
        }
    }
}

#[test]
fn fpt_plot_draws_runs_on_shared_axes_and_report_takes_run_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dirs = Vec::new();
    let records = fixture().join("records");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&records)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for path in names.iter().take(2) {
        let r: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let dir = tmp.path().join(r["key"].as_str().unwrap());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("spec.json"), serde_json::to_string(&r["spec"]).unwrap()).unwrap();
        std::fs::write(dir.join("result.json"), serde_json::to_string(&r["result"]).unwrap()).unwrap();
        let lines: Vec<String> = r["evals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        std::fs::write(dir.join("metrics.jsonl"), lines.join("\n")).unwrap();
        dirs.push((dir, r));
    }
    let svg_path = tmp.path().join("plot/loss.svg");
    std::fs::create_dir_all(svg_path.parent().unwrap()).unwrap();
    let out = fpt(&[
        "plot",
        dirs[0].0.to_str().unwrap(),
        dirs[1].0.to_str().unwrap(),
        "--metric",
        "train-loss",
        "--out",
        svg_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.contains("training loss by step"));
    let points: usize = dirs.iter().map(|(_, r)| r["evals"].as_array().unwrap().len()).sum();
    assert_eq!(svg.matches("<circle").count(), points, "every evaluation of both runs");
    for (dir, _) in &dirs {
        let key = dir.file_name().unwrap().to_str().unwrap();
        assert!(svg.contains(key), "the legend names {key}");
    }
    // A bad metric and a directory that is not a run: exit 2, named.
    let out = fpt(&["plot", dirs[0].0.to_str().unwrap(), "--metric", "speed"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("speed"));
    let out = fpt(&["plot", tmp.path().join("plot").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
    // `fpt report` on run directories: an index of them and a page each.
    let site = tmp.path().join("site-of-runs");
    let out = fpt(&[
        "report",
        dirs[0].0.to_str().unwrap(),
        dirs[1].0.to_str().unwrap(),
        "--out",
        site.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let index = std::fs::read_to_string(site.join("index.html")).unwrap();
    for (dir, r) in &dirs {
        let key = dir.file_name().unwrap().to_str().unwrap();
        assert!(index.contains(&format!("href=\"site/run-{key}.html\"")));
        let acc = r["result"]["test_accuracy"].as_f64().unwrap();
        assert!(index.contains(&format!("{:.1}%", 100.0 * acc)));
        assert!(site.join(format!("site/run-{key}.html")).is_file());
    }
}

#[test]
fn report_refuses_what_is_not_results_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere");
    let out = fpt(&["report", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"));
    // An empty directory: no reports to show.
    let out = fpt(&["report", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no reports"));
    // A corrupt report: named, and no index written.
    let bad = tmp.path().join("table2/cpu");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("report.json"), "{\"id\": \"table2\", \"cells\": [").unwrap();
    let out = fpt(&["report", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("report.json"), "{err}");
    assert!(!tmp.path().join("index.html").exists());
}

/// Headless Chromium opens the index and Table 2's page: the script ran (it marks the body
/// `data-ready="1"`), no console error, the key elements there; screenshots of both.
#[test]
fn the_site_loads_in_headless_chromium() {
    let chromium = std::env::var("FPT_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        assert!(
            std::env::var("FPT_REQUIRE_CHROMIUM").is_err(),
            "FPT_REQUIRE_CHROMIUM is set but there is no Chromium at {chromium} (apt-get install chromium)"
        );
        eprintln!("skipped: no Chromium at {chromium} (`cargo xtask site --browser` installs it and runs this test)");
        return;
    }
    let (tmp, results) = built_site();
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/site-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let browse = |page: &Path, extra: &[String]| -> Output {
        let profile = tempfile::tempdir_in(tmp.path()).unwrap();
        let mut c = Command::new(&chromium);
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,1400",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(format!("file://{}", page.display()));
        c.output().expect("run chromium")
    };
    let table = results.join("site/table2-cpu.html");
    for (page, shot, must) in [
        (
            results.join("index.html"),
            "index.png",
            vec!["id=\"reports\"", "id=\"claims\"", "data-report=\"table2-cpu\""],
        ),
        (
            table.clone(),
            "table2-cpu.png",
            vec!["id=\"grid\"", "id=\"cells\"", "class=\"spark\""],
        ),
    ] {
        let out = browse(&page, &["--dump-dom".to_string()]);
        let dom = String::from_utf8_lossy(&out.stdout);
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "chromium failed on {}: {log}", page.display());
        assert!(
            dom.contains("data-ready=\"1\""),
            "{}: the page's script did not finish: {log}",
            page.display()
        );
        for m in must {
            assert!(dom.contains(m), "{}: {m} missing from the DOM", page.display());
        }
        // Chromium logs every console message (an error, an uncaught exception, a failed
        // load) as a `CONSOLE` line; the pages log nothing.
        let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
        assert!(console.is_empty(), "{}: console messages: {console:?}", page.display());
        let path = shots.join(shot);
        let out = browse(&page, &[format!("--screenshot={}", path.display())]);
        assert!(out.status.success(), "screenshot of {}", page.display());
        let png = std::fs::read(&path).unwrap();
        assert!(
            png.len() > 10_000 && png.starts_with(b"\x89PNG"),
            "{} is a real screenshot",
            path.display()
        );
    }
}
