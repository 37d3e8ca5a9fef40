//! The primitives of the sled backend's binary values (`record.rs`, `codec.rs`):
//! fixed-width big-endian integers, LEB128 lengths, optional fields. Every read fails
//! cleanly on truncated or malformed input, so a damaged value is reported as corrupt,
//! never misread.

/// Appends fields to a value.
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }

    /// A LEB128 unsigned integer: lengths and counts, mostly one byte.
    pub(crate) fn var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.var(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u64(v);
            }
            None => self.u8(0),
        }
    }

    pub(crate) fn opt_u16(&mut self, v: Option<u16>) {
        match v {
            Some(v) => {
                self.u8(1);
                self.u16(v);
            }
            None => self.u8(0),
        }
    }

    pub(crate) fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
}

/// Reads fields off the front of a value.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or("value truncated")?;
        self.0 = rest;
        Ok(*head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.take()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    pub(crate) fn var(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("length over 64 bits".into())
    }

    /// A count of items still to read, checked against the bytes left (each item takes
    /// at least one), so a damaged count cannot make the caller allocate at will.
    pub(crate) fn count(&mut self) -> Result<usize, String> {
        let n = self.var()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.0.len())
            .ok_or_else(|| format!("count {n} exceeds the value"))
    }

    pub(crate) fn str(&mut self) -> Result<String, String> {
        let len = self.var()?;
        let len = usize::try_from(len).map_err(|_| "string over the address space")?;
        let bytes = self.0.get(..len).ok_or("string truncated")?;
        self.0 = &self.0[len..];
        String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
    }

    fn present(&mut self) -> Result<bool, String> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("bad option tag {b}")),
        }
    }

    pub(crate) fn opt_u64(&mut self) -> Result<Option<u64>, String> {
        Ok(if self.present()? { Some(self.u64()?) } else { None })
    }

    pub(crate) fn opt_u16(&mut self) -> Result<Option<u16>, String> {
        Ok(if self.present()? { Some(self.u16()?) } else { None })
    }

    pub(crate) fn opt_str(&mut self) -> Result<Option<String>, String> {
        Ok(if self.present()? { Some(self.str()?) } else { None })
    }

    /// Fails unless every byte was read.
    pub(crate) fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes after the value", self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(v in any::<u64>()) {
            let mut w = Writer(Vec::new());
            w.var(v);
            let mut r = Reader(&w.0);
            prop_assert_eq!(r.var(), Ok(v));
            prop_assert!(r.end().is_ok());
        }
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert!(Reader(&[0xff; 11]).var().is_err());
        assert!(Reader(&[5, b'a']).str().is_err());
        assert!(Reader(&[200, 1]).count().is_err());
        assert!(Reader(&[2]).opt_u64().is_err());
        assert!(Reader(&[1, 0xff]).str().is_err());
    }
}
