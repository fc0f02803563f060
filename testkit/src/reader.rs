//! Bytes as a stream of small choices.

/// Reads bytes as a stream of small choices; past the end every read is 0.
pub(crate) struct Reader<'a> {
    pub(crate) data: &'a [u8],
}

impl Reader<'_> {
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
