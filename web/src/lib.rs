//! dpw in a web page: the `Trainer` the page drives from JavaScript (see `web/app.js`). The
//! model, data reader, training step and loss are dpw's own; only file access (the page
//! fetches the files), blocking read-backs (awaited here) and threads differ from `dpw train`.

mod fetch;
mod platform;
mod session;

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use dpw::backend::cpu::Cpu;
use dpw::backend::wgpu::Wgpu;
use dpw::config::Config;
use dpw::data::MemFiles;
use dpw::train::setup::{prepare_in, Start};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use session::Session;

enum Engine {
    Gpu(Box<Session<Wgpu>>),
    Cpu(Box<Session<Cpu>>),
}

/// The same code on whichever session the engine holds.
macro_rules! on_session {
    ($engine:expr, $s:ident => $body:expr) => {
        match $engine {
            Engine::Gpu($s) => $body,
            Engine::Cpu($s) => $body,
        }
    };
}

/// A training run in the page. A call takes the engine out while it runs, so a second call
/// meanwhile finds none and is refused instead of interleaving with the first; the step count
/// is kept beside it so that it can be read meanwhile.
#[wasm_bindgen]
pub struct Trainer {
    engine: Rc<RefCell<Option<Engine>>>,
    steps: Rc<RefCell<usize>>,
    info: Value,
}

fn take(engine: &RefCell<Option<Engine>>) -> Result<Engine, JsError> {
    engine
        .borrow_mut()
        .take()
        .ok_or_else(|| JsError::new("the trainer is busy with another call"))
}

fn js_error(e: anyhow::Error) -> JsError {
    JsError::new(&format!("{e:#}"))
}

/// The files the page fetched, by path relative to the input file ("data/train/type.raw").
fn mem_files(files: &js_sys::Map) -> Result<MemFiles> {
    let mut out = MemFiles::default();
    let mut bad = None;
    files.for_each(&mut |value, key| match key.as_string() {
        Some(k) if value.is_instance_of::<js_sys::Uint8Array>() => {
            out.insert(k, js_sys::Uint8Array::new(&value).to_vec());
        }
        _ => bad = Some(format!("{key:?}")),
    });
    match bad {
        Some(k) => bail!("file {k}: expected a path with a Uint8Array of its bytes"),
        None => Ok(out),
    }
}

/// The WebGPU device, or why there is none.
async fn webgpu() -> Result<Wgpu> {
    if !wgpu::util::is_browser_webgpu_supported().await {
        bail!("this browser offers no WebGPU adapter (navigator.gpu is missing or gives none)");
    }
    Wgpu::with_backends(
        wgpu::Backends::BROWSER_WEBGPU,
        wgpu::PowerPreference::HighPerformance,
    )
    .await
}

/// Keeps the first error WebGPU reports out of band (a shader that fails to compile, a lost
/// device) instead of wgpu's default, which panics.
fn watch_errors(w: &Wgpu) -> Box<dyn Fn() -> Option<String>> {
    let slot: Arc<Mutex<Option<String>>> = Arc::default();
    let keep = Arc::clone(&slot);
    w.device()
        .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            keep.lock().unwrap().get_or_insert_with(|| e.to_string());
        }));
    Box::new(move || slot.lock().unwrap().clone())
}

async fn create(input: &str, files: &js_sys::Map, backend: &str) -> Result<(Engine, Value)> {
    let value: Value = serde_json::from_str(input).context("input.json is not valid JSON")?;
    let cfg = Config::from_value(&value, Path::new("")).context("input.json")?;
    if cfg.training.seed.is_none() {
        bail!("input.json: the page needs training.seed (it has no clock-based seed)");
    }
    let fs = mem_files(files)?;
    let setup = prepare_in(
        &fs,
        cfg,
        Start::Fresh,
        true,
        Path::new(""),
        web_time::Instant::now(),
    )?;
    let (gpu, note, fallback) = match backend {
        "cpu" => (
            None,
            "the CPU backend was asked for (?backend=cpu)".to_string(),
            false,
        ),
        "webgpu" => (
            Some(webgpu().await?),
            "WebGPU was asked for".to_string(),
            false,
        ),
        "auto" => match webgpu().await {
            Ok(w) => (Some(w), "WebGPU is available".to_string(), false),
            Err(e) => (
                None,
                format!("{e:#}; training on the CPU in WebAssembly instead"),
                true,
            ),
        },
        other => bail!("backend {other:?}: expected auto, webgpu or cpu"),
    };
    let (engine, name, adapter, dense) = match gpu {
        Some(w) => {
            let adapter = w.adapter_name().to_string();
            let dense = w.dense_kernels().name();
            let errors = watch_errors(&w);
            let s = Session::new(w, setup, errors)?;
            (Engine::Gpu(Box::new(s)), "webgpu", adapter, dense)
        }
        None => {
            let s = Session::new(Cpu::default(), setup, Box::new(|| None))?;
            (Engine::Cpu(Box::new(s)), "cpu", String::new(), "")
        }
    };
    let (natoms, nparams, numb_steps, disp_freq) = on_session!(&engine, s => (
        s.natoms(),
        s.nparams(),
        s.numb_steps(),
        s.disp_freq()
    ));
    let info = json!({
        "backend": name,
        "adapter": adapter,
        "dense_kernels": dense,
        "fallback": fallback,
        "note": note,
        "precision": "float32",
        "natoms": natoms,
        "nparams": nparams,
        "numb_steps": numb_steps,
        "disp_freq": disp_freq,
    });
    Ok((engine, info))
}

#[wasm_bindgen]
impl Trainer {
    /// Reads the input and the data, computes the statistics, opens the backend ("auto",
    /// "webgpu" or "cpu") and initialises the model, as `dpw train` does before its first step.
    pub async fn create(
        input: String,
        files: js_sys::Map,
        backend: String,
    ) -> Result<Trainer, JsError> {
        platform::install_panic_hook();
        let (engine, info) = create(&input, &files, &backend).await.map_err(js_error)?;
        Ok(Trainer {
            engine: Rc::new(RefCell::new(Some(engine))),
            steps: Rc::default(),
            info,
        })
    }

    /// The backend and the run's sizes, as JSON.
    pub fn info(&self) -> String {
        self.info.to_string()
    }

    /// Steps trained so far.
    #[wasm_bindgen(js_name = step_count)]
    pub fn step_count(&self) -> usize {
        *self.steps.borrow()
    }

    /// Trains to the next displayed step; resolves to that lcurve.out line as JSON.
    pub fn train(&self) -> js_sys::Promise {
        self.call(async |e| on_session!(e, s => s.train_to_display().await))
    }

    /// The first validation frame with reference and predicted forces, as JSON.
    pub fn frame(&self) -> js_sys::Promise {
        self.call(async |e| on_session!(e, s => s.frame().await))
    }
}

impl Trainer {
    /// Runs `f` on the engine, taken out for the call's duration; resolves to its JSON as text.
    fn call(&self, f: impl AsyncFnOnce(&mut Engine) -> Result<Value> + 'static) -> js_sys::Promise {
        let (engine, steps) = (Rc::clone(&self.engine), Rc::clone(&self.steps));
        wasm_bindgen_futures::future_to_promise(async move {
            let mut e = take(&engine)?;
            let out = f(&mut e).await;
            *steps.borrow_mut() = on_session!(&e, s => s.step());
            *engine.borrow_mut() = Some(e);
            Ok(out.map_err(js_error)?.to_string().into())
        })
    }
}
