//! The page's training run: `dpw train`'s own [`Run`] (step, display, validation), stepped
//! from the page's async loop, which awaits the read-backs that `dpw train` blocks on.

use std::sync::Arc;

use anyhow::{bail, Result};
use dpw::config::Precision;
use dpw::data::SystemStore;
use dpw::model::ModelSpec;
use dpw::train::batch::assemble_frames;
use dpw::train::lcurve::Metrics;
use dpw::train::run::{Driver, Run};
use dpw::train::setup::TrainSetup;
use serde_json::{json, Value};

use crate::fetch::Fetch;
use crate::platform::yield_to_page;

pub struct Session<B: Fetch> {
    b: B,
    run: Run<f32, B>,
    spec: ModelSpec,
    /// The training systems (the frame shown without validation data).
    train: Arc<SystemStore>,
    disp_freq: usize,
    reads: PageReads,
}

/// The page's [`Driver`]: read-backs awaited, each failing with the first error the device
/// reported meanwhile.
struct PageReads {
    /// A device error reported out of band (WebGPU validation, device loss).
    device_error: Box<dyn Fn() -> Option<String>>,
}

impl<B: Fetch> Driver<f32, B> for PageReads {
    async fn read(&mut self, b: &B, buf: &B::Buf) -> Result<Vec<f32>> {
        let v = b.fetch(buf).await;
        if let Some(e) = (self.device_error)() {
            bail!("the GPU reported an error: {e}");
        }
        v
    }
}

fn metrics_json(m: &Metrics) -> Value {
    m.entries()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

impl<B: Fetch> Session<B> {
    /// A fresh run from `setup` (see `dpw::train::setup::prepare_in`), as `dpw train` would
    /// start it with the same input.
    pub fn new(
        b: B,
        setup: TrainSetup,
        device_error: Box<dyn Fn() -> Option<String>>,
    ) -> Result<Self> {
        if setup.precision != Precision::F32 {
            bail!(
                "the page trains in float32 (WebGPU has no 64-bit floats): set \"precision\": \"float32\" in the descriptor and fitting_net"
            );
        }
        let spec = setup.model.spec.clone();
        let disp_freq = setup.config.training.disp_freq;
        let train = Arc::clone(&setup.train.store);
        let run = Run::fresh(&b, setup)?;
        Ok(Session {
            run,
            spec,
            disp_freq,
            train,
            b,
            reads: PageReads { device_error },
        })
    }

    pub fn step(&self) -> usize {
        self.run.steps_done()
    }

    pub fn natoms(&self) -> usize {
        self.run.systems()[0].natoms
    }

    pub fn nparams(&self) -> usize {
        self.run.dm().nparams
    }

    pub fn numb_steps(&self) -> usize {
        self.run.numb_steps()
    }

    pub fn disp_freq(&self) -> usize {
        self.disp_freq
    }

    /// Trains up to the next step that `dp train` prints (step 1, then every disp_freq steps)
    /// or the last, and returns it as JSON: step, lr, trn and val metrics, the lcurve.out text
    /// (null for a last step that is not printed), and whether the run is done.
    pub async fn train_to_display(&mut self) -> Result<Value> {
        loop {
            let plan = self.run.step(&self.b, &mut self.reads)?;
            let shown = self.run.finish(&self.b, &mut self.reads).await?;
            if shown.is_some() || plan.last {
                let (trn, val, lcurve) = match &shown {
                    Some(s) => (s.trn, s.val.as_ref(), Some(s.lcurve.as_str())),
                    None => (*self.run.last_trn(), None, None),
                };
                return Ok(json!({
                    "step": plan.done,
                    "lr": plan.lr,
                    "trn": metrics_json(&trn),
                    "val": val.map(metrics_json),
                    "lcurve": lcurve,
                    "done": plan.last,
                }));
            }
            if B::ON_PAGE_THREAD {
                yield_to_page().await;
            }
        }
    }

    /// The first validation frame (or training frame without validation data) with its
    /// reference forces and the model's, atoms sorted by type.
    pub async fn frame(&mut self) -> Result<Value> {
        let sys = match self.run.validation_data() {
            Some(v) => v.system(0)?,
            None => self.train.get(0)?,
        };
        let batch = assemble_frames(&self.spec, &sys, &[0], "display")?;
        let w = self.run.predict(&self.b, &batch)?;
        let force = self.reads.read(&self.b, &w.force).await?;
        Ok(json!({
            "type_map": self.spec.type_map,
            "types": sys.frame_atype(0),
            "box": sys.frame_cell(0),
            "coord": sys.frame_coord(0),
            "force_ref": sys.frame_force(0),
            "force_pred": force,
        }))
    }
}
