//! Reading device buffers without blocking: a page cannot wait for the GPU, it awaits it.

use anyhow::Result;
use dpw::backend::cpu::Cpu;
use dpw::backend::wgpu::Wgpu;
use dpw::backend::{Backend, Device};

pub trait Fetch: Backend<f32> {
    /// The ops run on the page's own thread, so training hands control back to the page
    /// between steps to keep it responsive.
    const ON_PAGE_THREAD: bool;

    async fn fetch(&self, b: &Self::Buf) -> Result<Vec<f32>>;
}

impl Fetch for Cpu {
    const ON_PAGE_THREAD: bool = true;

    async fn fetch(&self, b: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(self.download(b))
    }
}

impl Fetch for Wgpu {
    const ON_PAGE_THREAD: bool = false;

    async fn fetch(&self, b: &Self::Buf) -> Result<Vec<f32>> {
        self.download_async(b).await
    }
}
