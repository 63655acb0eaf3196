//! Kernel parameter buffers: the bytes a launch passes, laid out as the `.entry` signature
//! says (each parameter at the next offset aligned to its alignment, as the driver packs them).
//!
//! [`ParamBuilder`] builds such a buffer (for tests and tools that use the `extra` launch
//! form or need the layout); [`ParamReader`] reads one back in a twin. Neither knows any
//! particular kernel.

/// Builds a parameter buffer one parameter at a time.
#[derive(Debug, Default, Clone)]
pub struct ParamBuilder {
    buf: Vec<u8>,
}

impl ParamBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends raw bytes at the next offset aligned to `align` (a power of two).
    pub fn bytes(mut self, data: &[u8], align: usize) -> Self {
        let align = align.max(1);
        let at = self.buf.len().div_ceil(align) * align;
        self.buf.resize(at, 0);
        self.buf.extend_from_slice(data);
        self
    }

    pub fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_ne_bytes(), 4)
    }

    pub fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_ne_bytes(), 8)
    }

    pub fn f32(self, v: f32) -> Self {
        self.bytes(&v.to_ne_bytes(), 4)
    }

    /// A device pointer (`u64`).
    pub fn ptr(self, v: u64) -> Self {
        self.u64(v)
    }

    /// The finished buffer.
    pub fn build(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads parameters in signature order from a buffer laid out like [`ParamBuilder`]'s.
#[derive(Debug, Clone)]
pub struct ParamReader<'a> {
    buf: &'a [u8],
    at: usize,
}

/// The buffer ended before the parameter at `offset` (of `size` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortParams {
    pub offset: usize,
    pub size: usize,
}

impl<'a> ParamReader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    /// The next `size` bytes at the next offset aligned to `align`.
    pub fn bytes(&mut self, size: usize, align: usize) -> Result<&'a [u8], ShortParams> {
        let align = align.max(1);
        let offset = self.at.div_ceil(align) * align;
        let end = offset
            .checked_add(size)
            .ok_or(ShortParams { offset, size })?;
        let slice = self
            .buf
            .get(offset..end)
            .ok_or(ShortParams { offset, size })?;
        self.at = end;
        Ok(slice)
    }

    pub fn u32(&mut self) -> Result<u32, ShortParams> {
        let b = self.bytes(4, 4)?;
        Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, ShortParams> {
        let b = self.bytes(8, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_ne_bytes(a))
    }

    pub fn f32(&mut self) -> Result<f32, ShortParams> {
        Ok(f32::from_bits(self.u32()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_aligns_like_the_driver_and_reader_reads_back() {
        // (f32, u64, u32, u64): 0..4, pad, 8..16, 16..20, pad, 24..32
        let buf = ParamBuilder::new().f32(1.5).u64(7).u32(9).u64(11).build();
        assert_eq!(buf.len(), 32);
        let mut r = ParamReader::new(&buf);
        assert_eq!(r.f32(), Ok(1.5));
        assert_eq!(r.u64(), Ok(7));
        assert_eq!(r.u32(), Ok(9));
        assert_eq!(r.u64(), Ok(11));
        assert_eq!(
            r.u32(),
            Err(ShortParams {
                offset: 32,
                size: 4
            })
        );
    }
}
