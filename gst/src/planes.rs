//! Where a frame's planes are, and copying them between layouts (a pitched CUDA buffer, a
//! packed system buffer, a slot) on the CPU or on a CUDA stream.

use gpuring::cuda::driver::{self, Rows};

use crate::header::{FrameHeader, MAX_PLANES};

/// One plane: its offset from the buffer's start, bytes between rows, and rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    /// From the buffer's start.
    pub offset: usize,
    /// Bytes from one row's start to the next.
    pub stride: usize,
    /// Rows.
    pub rows: usize,
}

/// A frame's planes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Invariant: 1..=4 planes.
    pub planes: Vec<Plane>,
}

impl Layout {
    /// The layout of a frame of `info`'s format and size at the given offsets and strides.
    pub fn new(info: &gst_video::VideoInfo, offsets: &[usize], strides: &[i32]) -> Layout {
        let finfo = info.format_info();
        let n = (info.n_planes() as usize).clamp(1, MAX_PLANES);
        let planes = (0..n)
            .map(|p| {
                // The plane's rows are those of a component stored in it.
                let comp = (0..finfo.n_components())
                    .find(|&c| finfo.plane()[c as usize] as usize == p)
                    .unwrap_or(0);
                Plane {
                    offset: offsets[p],
                    stride: strides[p].unsigned_abs() as usize,
                    rows: finfo.scale_height(comp as u8, info.height()) as usize,
                }
            })
            .collect();
        Layout { planes }
    }

    /// `info`'s own (default, packed) layout.
    pub fn of_info(info: &gst_video::VideoInfo) -> Layout {
        Layout::new(info, info.offset(), info.stride())
    }

    /// The layout a frame header describes, for a frame of `info`.
    pub fn of_header(info: &gst_video::VideoInfo, h: &FrameHeader) -> Layout {
        let offsets: Vec<usize> = h.offsets.iter().map(|&o| o as usize).collect();
        let strides: Vec<i32> = h.strides.iter().map(|&s| s as i32).collect();
        Layout::new(info, &offsets, &strides)
    }

    /// Bytes from the start to the end of the last row of the last plane.
    pub fn extent(&self) -> usize {
        self.planes.iter().map(|p| p.offset + p.stride * p.rows).max().unwrap_or(0)
    }

    /// Copies every plane of `src` (laid out as `self`) into `dst` (laid out as `to`), on the
    /// CPU: `min(stride)` bytes per row, which covers each row's pixels. `None` if either
    /// buffer is too short for its layout, or the layouts have different planes.
    pub fn copy_cpu(&self, src: &[u8], to: &Layout, dst: &mut [u8]) -> Option<()> {
        if self.planes.len() != to.planes.len()
            || src.len() < self.extent()
            || dst.len() < to.extent()
        {
            return None;
        }
        for (s, d) in self.planes.iter().zip(&to.planes) {
            let width = s.stride.min(d.stride);
            for row in 0..s.rows.min(d.rows) {
                let (so, dof) = (s.offset + row * s.stride, d.offset + row * d.stride);
                dst[dof..dof + width].copy_from_slice(&src[so..so + width]);
            }
        }
        Some(())
    }

    /// Queues on `stream` copies of every plane of the frame at `src` (laid out as `self`) into
    /// `dst` (laid out as `to`): across CUDA contexts, or between device and host memory.
    ///
    /// # Safety
    /// 1. `src` and `dst` must hold their layouts' [`extent`](Self::extent) bytes, readable
    ///    and writable, until the copies have run; the layouts must have the same planes.
    /// 2. `stream` must be live in the current context.
    pub unsafe fn copy_cuda(
        &self,
        src: Base,
        to: &Layout,
        dst: Base,
        stream: driver::CUstream,
    ) -> Result<(), driver::DriverError> {
        for (s, d) in self.planes.iter().zip(&to.planes) {
            let width = s.stride.min(d.stride);
            let rows = s.rows.min(d.rows);
            // SAFETY: each plane lies within its buffer's extent, by (1); stream by (2).
            unsafe {
                driver::memcpy_2d_peer_async(dst.rows(d), src.rows(s), width, rows, stream)?;
            }
        }
        Ok(())
    }
}

/// The start of a buffer a CUDA copy reads or writes.
#[derive(Clone, Copy, Debug)]
pub enum Base {
    /// Device memory of a context.
    Device(u64, driver::CUcontext),
    /// Host memory.
    Host(*mut u8),
}

impl Base {
    fn rows(self, p: &Plane) -> Rows {
        match self {
            Base::Device(ptr, ctx) => {
                Rows::Device { ptr: ptr + p.offset as u64, pitch: p.stride, ctx }
            }
            // The offset stays inside the buffer (the caller's guarantee).
            Base::Host(ptr) => Rows::Host { ptr: ptr.wrapping_add(p.offset), pitch: p.stride },
        }
    }
}
