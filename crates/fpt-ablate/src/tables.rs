//! The table and scale files (`data/tables/<id>.toml`, `scales.toml`): listed, read
//! strictly and checked (claims, labels, paper numbers).

#[allow(unused_imports)]
use super::*;

/// The ids of every table and figure spec in `dir`, in paper order.
pub fn list(dir: &Path) -> Result<Vec<String>> {
    let mut ids: Vec<String> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let id = name.strip_suffix(".toml")?;
            (id.starts_with("table") || id.starts_with("fig")).then(|| id.to_string())
        })
        .collect();
    let key = |id: &str| {
        let (kind, n) = if let Some(n) = id.strip_prefix("table") {
            (0, n)
        } else {
            (1, id.trim_start_matches("fig"))
        };
        (kind, n.parse::<u32>().unwrap_or(u32::MAX), id.to_string())
    };
    ids.sort_by_key(|id| key(id));
    Ok(ids)
}

/// Reads `dir/<id>.toml`, checking that the paper's numbers fill the grid.
pub fn load_table(dir: &Path, id: &str) -> Result<TableSpec> {
    let path = dir.join(format!("{id}.toml"));
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let t: TableSpec = toml::from_str(&text).map_err(|e| AblateError::Spec {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    let bad = |msg: String| AblateError::Spec {
        path: path.clone(),
        msg,
    };
    if t.id != id {
        return Err(bad(format!("id `{}` does not match the file name", t.id)));
    }
    if t.kind == fpt_spec::table::Kind::Table && (t.rows.is_empty() || t.cols.is_empty()) {
        return Err(bad("a table needs rows and cols".into()));
    }
    for o in &t.cells {
        if !t.rows.iter().any(|r| r.label == o.row) || !t.cols.iter().any(|c| c.label == o.col) {
            return Err(bad(format!(
                "cell override ({}, {}) names no row/column of the table",
                o.row, o.col
            )));
        }
    }
    // Claims may name alternate rows: checked against the table with all of them.
    let full = crate::expand::with_alternates(&t, |_| true).map_err(&bad)?;
    for c in &t.claims {
        claims::validate(&full, c).map_err(&bad)?;
    }
    if !t.rows.is_empty() {
        if t.paper.len() != t.rows.len() {
            return Err(bad(format!(
                "paper has {} rows, the table {}",
                t.paper.len(),
                t.rows.len()
            )));
        }
        for (i, r) in t.paper.iter().enumerate() {
            if r.len() != t.cols.len() {
                return Err(bad(format!(
                    "paper row {} (`{}`) has {} numbers for {} columns",
                    i + 1,
                    t.rows[i].label,
                    r.len(),
                    t.cols.len()
                )));
            }
        }
    }
    Ok(t)
}

/// Reads `dir/scales.toml`.
pub fn load_scales(dir: &Path) -> Result<BTreeMap<String, ScaleSettings>> {
    let path = dir.join("scales.toml");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    toml::from_str(&text).map_err(|e| AblateError::Spec {
        path: path.clone(),
        msg: e.to_string(),
    })
}
