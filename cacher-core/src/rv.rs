//! Resource versions as clients write them.
//!
//! Kubernetes counterpart: `storage/api_object_versioner.go` (`ParseResourceVersion`): the
//! strings `""` and `"0"` both parse to 0 but mean different things to the cacher, so they stay
//! distinct here ("parse, don't validate").

use alloc::format;

use crate::status::Status;

/// The `resourceVersion` parameter of a watch, list or get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RvParam {
    /// `""`: unset. For lists and gets, "most recent" (a consistent read).
    Unset,
    /// `"0"`: "any" — whatever the cache has.
    Zero,
    /// `"N"` with N > 0: at least (or exactly) N.
    At(u64),
}

impl RvParam {
    /// Parses a client's `resourceVersion`. Anything but a base-10 `u64` is a 400.
    pub fn parse(s: &str) -> Result<RvParam, Status> {
        if s.is_empty() {
            return Ok(RvParam::Unset);
        }
        match parse_u64(s) {
            Some(0) => Ok(RvParam::Zero),
            Some(n) => Ok(RvParam::At(n)),
            None => Err(Status::bad_request(format!(
                "resourceVersion: Invalid value: {s:?}: must be an unsigned 64-bit decimal integer"
            ))),
        }
    }

    /// The numeric value (0 for unset and zero), as `ParseResourceVersion` returns it.
    pub const fn value(self) -> u64 {
        match self {
            RvParam::Unset | RvParam::Zero => 0,
            RvParam::At(n) => n,
        }
    }

    /// True for `""`.
    pub const fn is_unset(self) -> bool {
        matches!(self, RvParam::Unset)
    }
}

impl core::fmt::Display for RvParam {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RvParam::Unset => f.write_str(""),
            RvParam::Zero => f.write_str("0"),
            RvParam::At(n) => write!(f, "{n}"),
        }
    }
}

/// Strict base-10 `u64`: digits only, no sign, no whitespace, no overflow.
pub(crate) fn parse_u64(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_kubernetes() {
        assert_eq!(RvParam::parse("").unwrap(), RvParam::Unset);
        assert_eq!(RvParam::parse("0").unwrap(), RvParam::Zero);
        assert_eq!(RvParam::parse("00").unwrap(), RvParam::Zero);
        assert_eq!(RvParam::parse("123").unwrap(), RvParam::At(123));
        assert_eq!(RvParam::parse("18446744073709551615").unwrap(), RvParam::At(u64::MAX));
        for bad in ["abc", "-1", " 1", "1 ", "+1", "18446744073709551616", "1.0", "0x10"] {
            let err = RvParam::parse(bad).unwrap_err();
            assert_eq!(err.code(), 400, "{bad}");
            assert!(err.message.contains("resourceVersion"), "{}", err.message);
        }
    }
}
