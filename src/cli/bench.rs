//! `dpw bench`: trains an input for a fixed number of steps after a warm-up, with no output
//! files kept, and reports the median s/step, steps/s, peak memory and start-up time. With
//! `--profile`, the backend runs wrapped in [`Timed`] and the report adds, per op, the time per
//! step, its share of the step, the FLOPs per step and the achieved GFLOP/s; and per step the
//! launches, uploads, read-backs, buffers and bind groups (the backend's own counts on a GPU).

use std::path::{Path, PathBuf};
use web_time::Instant;

use anyhow::{Context, Result};
use serde_json::json;

use super::backend::{open_cuda, open_wgpu, run_job, BackendChoice, Job};
use super::train::TrainJob;
use crate::backend::cpu::Cpu;
use crate::backend::timed::{Profile, Timeable, Timed};
use crate::backend::Real;
use crate::config::{load_config, Precision};
use crate::dist::DeviceLink;
use crate::train::setup::{prepare, Start};
use crate::train::trainer::TrainReport;

pub struct BenchArgs {
    pub input: PathBuf,
    pub steps: usize,
    pub warmup: usize,
    pub backend: BackendChoice,
    /// Overrides the input's precision with float32.
    pub float32: bool,
    pub json: Option<PathBuf>,
    /// Time every backend op (see [`crate::backend::timed`]).
    pub profile: bool,
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
        let mut setup = prepare(
            load_config(&args.input)?,
            Start::Fresh,
            true,
            Path::new(&dir),
            t0,
        )?;
        let total = args.warmup + args.steps;
        let tc = &mut setup.config.training;
        tc.numb_steps = total;
        tc.disp_freq = total;
        tc.save_freq = total;
        if args.float32 {
            setup.precision = Precision::F32;
        }
        // A GPU backend only queues a step: without this the times would be the host's.
        setup.wait_each_step = true;
        let precision = setup.precision;
        let job = TrainJob::Single(Box::new(setup));
        let (report, profile) = if args.profile {
            let f64 = precision == Precision::F64;
            let (r, p) = match args.backend {
                BackendChoice::Cpu => profiled(Cpu::default(), f64, job, args.warmup)?,
                BackendChoice::Wgpu => profiled(open_wgpu(f64, false)?, f64, job, args.warmup)?,
                BackendChoice::Cuda => profiled(open_cuda()?, f64, job, args.warmup)?,
                BackendChoice::Auto => {
                    anyhow::bail!("--profile needs a named backend: --backend cpu, wgpu or cuda")
                }
            };
            (r, Some(p))
        } else {
            let r = run_job(args.backend, precision == Precision::F64, job)?;
            (r, None)
        };
        let timed = report.step_s[args.warmup.min(report.step_s.len())..].to_vec();
        let med = median(timed.clone());
        let mean = timed.iter().sum::<f64>() / timed.len() as f64;
        let profile = profile.map(|p| profile_json(&p, mean));
        Ok(json!({
            "input": args.input.display().to_string(),
            "backend": format!("{:?}", args.backend).to_lowercase(),
            "precision": precision.as_str(),
            "threads": rayon::current_num_threads(),
            "warmup_steps": args.warmup,
            "timed_steps": timed.len(),
            "median_s_per_step": med,
            "mean_s_per_step": mean,
            "steps_per_s": 1.0 / med,
            "startup_s": report.startup_s,
            "peak_memory_mb": peak_memory_mb(),
            "profile": profile,
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
    if let Some(p) = r.get("profile").filter(|p| !p.is_null()) {
        print_profile(p);
    }
    if let Some(p) = &args.json {
        crate::model::file::write_atomic(p, serde_json::to_string_pretty(&r)?.as_bytes())?;
    }
    Ok(r)
}

/// Trains on `inner` wrapped in [`Timed`], in float64 or float32; the profile skips the
/// warm-up steps.
fn profiled<B: Timeable<f64> + Timeable<f32>>(
    inner: B,
    f64: bool,
    job: TrainJob,
    warmup: usize,
) -> Result<(TrainReport, Profile)> {
    fn go<T: Real, B: Timeable<T>>(
        inner: B,
        job: TrainJob,
        warmup: usize,
    ) -> Result<(TrainReport, Profile)> {
        let timed = Timed::new(inner);
        tracing::info!(
            "backend: {}, precision {}",
            crate::backend::Device::<T>::name(&timed),
            T::NAME
        );
        let report = job.run::<T, Timed<B>>(&timed, DeviceLink::host())?;
        Ok((report, timed.profile(warmup)))
    }
    if f64 {
        go::<f64, B>(inner, job, warmup)
    } else {
        go::<f32, B>(inner, job, warmup)
    }
}

/// The profile as JSON: one entry per op, plus the part of the mean step spent outside ops
/// (batch assembly and neighbour lists on the host, the trainer's own work).
fn profile_json(p: &Profile, mean_step_s: f64) -> serde_json::Value {
    let share = |s: f64| {
        if mean_step_s > 0.0 {
            s / mean_step_s
        } else {
            0.0
        }
    };
    let ops: Vec<serde_json::Value> = p
        .ops
        .iter()
        .map(|o| {
            json!({
                "op": o.op.name(),
                "calls_per_step": o.calls_per_step,
                "ms_per_step": 1e3 * o.s_per_step,
                "share": share(o.s_per_step),
                "flops_per_step": o.flops_per_step,
                "gflops": o.gflops(),
            })
        })
        .collect();
    let outside = mean_step_s - p.s_per_step();
    let counts: serde_json::Map<String, serde_json::Value> = p
        .counts
        .iter()
        .map(|&(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "steps": p.steps,
        "counts_per_step": counts,
        "mean_step_ms": 1e3 * mean_step_s,
        "ops": ops,
        "outside_ops_ms_per_step": 1e3 * outside,
        "outside_ops_share": share(outside),
        "flops_per_step": p.flops_per_step(),
        "gflops_step": if mean_step_s > 0.0 { p.flops_per_step() / mean_step_s * 1e-9 } else { 0.0 },
    })
}

fn print_profile(p: &serde_json::Value) {
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "per-op profile, mean over {} steps (wall time of each call; FLOPs from the shapes, a multiply-add = 2):",
        p["steps"]
    );
    println!(
        "{:<20} {:>8} {:>9} {:>7} {:>12} {:>8}",
        "op", "calls", "ms/step", "share", "MFLOP/step", "GFLOP/s"
    );
    for o in p["ops"].as_array().into_iter().flatten() {
        println!(
            "{:<20} {:>8.1} {:>9.2} {:>6.1}% {:>12.1} {:>8.2}",
            o["op"].as_str().unwrap_or("?"),
            f(o, "calls_per_step"),
            f(o, "ms_per_step"),
            100.0 * f(o, "share"),
            1e-6 * f(o, "flops_per_step"),
            f(o, "gflops"),
        );
    }
    println!(
        "{:<20} {:>8} {:>9.2} {:>6.1}%",
        "(outside ops)",
        "",
        f(p, "outside_ops_ms_per_step"),
        100.0 * f(p, "outside_ops_share"),
    );
    if let Some(c) = p["counts_per_step"].as_object() {
        let line: Vec<String> = c
            .iter()
            .map(|(k, v)| format!("{k} {}", v.as_f64().unwrap_or(f64::NAN)))
            .collect();
        println!("per step: {}", line.join(", "));
    }
    println!(
        "{:<20} {:>8} {:>9.2} {:>6.1}% {:>12.1} {:>8.2}",
        "step (mean)",
        "",
        f(p, "mean_step_ms"),
        100.0,
        1e-6 * f(p, "flops_per_step"),
        f(p, "gflops_step"),
    );
}
