//! `dpw bench`: trains an input for a fixed number of steps after a warm-up, with no output
//! files kept, and reports the median s/step, steps/s, peak memory and start-up time.

use std::path::{Path, PathBuf};
use web_time::Instant;

use anyhow::{Context, Result};
use serde_json::json;

use super::backend::{run_job, BackendChoice};
use super::train::TrainJob;
use crate::config::Precision;
use crate::train::trainer::{prepare, Start};

pub struct BenchArgs {
    pub input: PathBuf,
    pub steps: usize,
    pub warmup: usize,
    pub backend: BackendChoice,
    /// Overrides the input's precision with float32.
    pub float32: bool,
    pub json: Option<PathBuf>,
}

/// Peak resident memory of this process (Linux `VmHWM`), in MB.
fn peak_memory_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn median(mut x: Vec<f64>) -> f64 {
    x.sort_by(f64::total_cmp);
    let n = x.len();
    if n % 2 == 1 {
        x[n / 2]
    } else {
        0.5 * (x[n / 2 - 1] + x[n / 2])
    }
}

pub fn run_bench(args: BenchArgs, t0: Instant) -> Result<serde_json::Value> {
    anyhow::ensure!(args.steps > 0, "--steps must be at least 1");
    let dir = std::env::temp_dir().join(format!("dpw-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = (|| -> Result<serde_json::Value> {
        let mut setup = prepare(&args.input, Start::Fresh, Path::new(&dir), t0)?;
        let total = args.warmup + args.steps;
        let tc = &mut setup.config.training;
        tc.numb_steps = total;
        tc.disp_freq = total;
        tc.save_freq = total;
        if args.float32 {
            setup.precision = Precision::F32;
        }
        let precision = setup.precision;
        let report = run_job(
            args.backend,
            precision == Precision::F64,
            TrainJob { setup },
        )?;
        let timed = report.step_s[args.warmup.min(report.step_s.len())..].to_vec();
        let med = median(timed.clone());
        Ok(json!({
            "input": args.input.display().to_string(),
            "backend": format!("{:?}", args.backend).to_lowercase(),
            "precision": precision.as_str(),
            "threads": rayon::current_num_threads(),
            "warmup_steps": args.warmup,
            "timed_steps": timed.len(),
            "median_s_per_step": med,
            "mean_s_per_step": timed.iter().sum::<f64>() / timed.len() as f64,
            "steps_per_s": 1.0 / med,
            "startup_s": report.startup_s,
            "peak_memory_mb": peak_memory_mb(),
        }))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let r = result?;
    println!(
        "{} on {} ({}): median {:.4} s/step, {:.2} steps/s over {} steps after {} warm-up; start-up {:.2} s; peak memory {} MB",
        r["input"].as_str().unwrap_or(""),
        r["backend"].as_str().unwrap_or(""),
        r["precision"].as_str().unwrap_or(""),
        r["median_s_per_step"].as_f64().unwrap_or(f64::NAN),
        r["steps_per_s"].as_f64().unwrap_or(f64::NAN),
        args.steps,
        args.warmup,
        r["startup_s"].as_f64().unwrap_or(f64::NAN),
        r["peak_memory_mb"].as_f64().map_or("?".into(), |m| format!("{m:.0}")),
    );
    if let Some(p) = &args.json {
        crate::model::file::write_atomic(p, serde_json::to_string_pretty(&r)?.as_bytes())?;
    }
    Ok(r)
}
