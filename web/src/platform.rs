//! The page's side of things: handing control back to its event loop, and panics reported
//! in words rather than as a bare "unreachable executed".

use std::cell::RefCell;

use wasm_bindgen::prelude::*;

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Resolves on the page's next macrotask, after it has drawn and handled input.
pub async fn yield_to_page() {
    let p = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(w) = web_sys::window() {
            let _ = w.set_timeout_with_callback(&resolve);
        } else {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(p).await;
}

/// Keeps a panic's message for [`last_panic`] and prints it to the console.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("dpw stopped on an internal error: {info}");
        web_sys::console::error_1(&msg.clone().into());
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(msg));
    }));
}

/// The message of the panic that stopped the module, if one did (the page shows it when a
/// call fails with a WebAssembly RuntimeError).
#[wasm_bindgen(js_name = lastPanic)]
pub fn last_panic() -> Option<String> {
    LAST_PANIC.with(|p| p.borrow().clone())
}
