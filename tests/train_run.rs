//! One training loop: the web page drives `dpw::train::run::Run` step by step from an async loop
//! whose read-backs wait; `dpw train` drives the same Run blocking. Both must print the same
//! lcurve.out, with gradient clipping and disp_avg on (which the page used to refuse).

mod common;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use anyhow::Result;
use dpw::backend::cpu::Cpu;
use dpw::backend::Device;
use dpw::config::Config;
use dpw::data::Disk;
use dpw::dist::DeviceLink;
use dpw::train::run::{Driver, Run};
use dpw::train::setup::{prepare_in, Start, TrainSetup};
use dpw::train::trainer::train;
use serde_json::{json, Value};

use common::tiny_water_input;

fn water(name: &str) -> String {
    format!("{}/examples/water/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The tiny water model with validation data, clipping and disp_avg, printing every 3 steps.
fn input() -> Value {
    let mut v = tiny_water_input(json!([water("data_0"), water("data_1")]), 10);
    let t = &mut v["training"];
    t["validation_data"] = json!({"systems": [water("data_3")], "batch_size": 2, "numb_btch": 2});
    t["disp_freq"] = json!(3);
    t["gradient_max_norm"] = json!(0.05);
    t["disp_avg"] = json!(true);
    v
}

fn setup(dir: &Path) -> TrainSetup {
    let cfg = Config::from_value(&input(), dir).unwrap();
    prepare_in(
        &Disk,
        cfg,
        Start::Fresh,
        true,
        dir,
        web_time::Instant::now(),
    )
    .unwrap()
}

/// Ready on its second poll: a read-back that is awaited, as the page's are.
struct NotYet(bool);

impl Future for NotYet {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// The page's kind of driver: every read waits once.
struct Awaiting;

impl Driver<f64, Cpu> for Awaiting {
    async fn read(&mut self, b: &Cpu, buf: &Vec<f64>) -> Result<Vec<f64>> {
        NotYet(false).await;
        Ok(b.download(buf))
    }
}

/// Polls `f` to its end; returns its output and how often it waited.
fn drive<F: Future>(f: F) -> (F::Output, usize) {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    let mut waits = 0;
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return (v, waits),
            Poll::Pending => waits += 1,
        }
    }
}

#[test]
fn page_loop_prints_the_lcurve_of_dpw_train() {
    let cli_dir = tempfile::tempdir().unwrap();
    let report =
        train::<f64, Cpu>(&Cpu::default(), DeviceLink::host(), setup(cli_dir.path())).unwrap();
    assert_eq!(report.steps, 10);
    let cli = std::fs::read_to_string(cli_dir.path().join("lcurve.out")).unwrap();

    // As the page runs it: Run::step, then Run::finish awaited, until the last step.
    let page_dir = tempfile::tempdir().unwrap();
    let b = Cpu::default();
    let mut run = Run::<f64, Cpu>::fresh(&b, setup(page_dir.path())).unwrap();
    let mut page = String::new();
    let (mut shown, mut waits) = (0, 0);
    while !run.is_done() {
        run.step(&b, &mut Awaiting).unwrap();
        let (line, w) = drive(run.finish(&b, &mut Awaiting));
        waits += w;
        if let Some(s) = line.unwrap() {
            page.push_str(&s.lcurve);
            shown += 1;
        }
    }
    // Steps 1, 3, 6 and 9 are printed; the reads at them (and at the last step) did wait.
    assert_eq!(shown, 4);
    assert!(waits >= 5, "the reads waited {waits} times");
    assert_eq!(
        page, cli,
        "the page's lcurve.out lines differ from dpw train's"
    );
    assert!(cli.lines().filter(|l| !l.starts_with('#')).count() == 4);
}
