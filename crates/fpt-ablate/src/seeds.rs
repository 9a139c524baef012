//! A cell's numbers over its seeds: their mean, spread and how a report labels them.

/// A cell's numbers over its seeds.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Seeds {
    /// Runs the cell asks for.
    pub runs: usize,
    /// The numbers of the runs that finished, seed order (the cell's own run first).
    pub values: Vec<f64>,
    /// Sample standard deviation of `values` (0 with fewer than two).
    pub sd: f64,
    /// The other seeds' run directories, relative to the results directory.
    pub other_runs: Vec<String>,
}

impl Seeds {
    /// From the finished runs' numbers.
    pub fn new(runs: usize, values: Vec<f64>, other_runs: Vec<String>) -> Seeds {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n.max(1.0);
        let sd = if values.len() > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Seeds {
            runs,
            values,
            sd,
            other_runs,
        }
    }

    /// The mean of the finished runs.
    pub fn mean(&self) -> Option<f64> {
        (!self.values.is_empty()).then(|| self.values.iter().sum::<f64>() / self.values.len() as f64)
    }

    /// How the grid and the cell table show the spread: `+-sd, n seeds` (no spread where
    /// one seed finished: one number has none).
    pub fn label(&self) -> String {
        if self.values.len() < 2 {
            format!("{} of {} seeds", self.values.len(), self.runs)
        } else if self.values.len() == self.runs {
            format!("+-{:.1}, {} seeds", self.sd, self.runs)
        } else {
            format!("+-{:.1}, {} of {} seeds", self.sd, self.values.len(), self.runs)
        }
    }
}
