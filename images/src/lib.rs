//! Guest images built from `guest-tools/` at compile time and embedded here.
//!
//! A fleet config names one as `image = "builtin:NAME"`.

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The ELF bytes of the built-in image `name`, if there is one.
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// Names of all built-in images, sorted.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_is_a_static_x86_64_elf_loaded_at_1mib() {
        let elf = builtin("hello").expect("hello is built in");
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(elf[4], 2, "64-bit");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 62, "x86_64");
        let entry = u64::from_le_bytes(elf[24..32].try_into().unwrap());
        assert_eq!(entry, 0x10_0000);
    }

    #[test]
    fn unknown_name_is_none_and_names_are_sorted() {
        assert!(builtin("no-such-image").is_none());
        let v: Vec<_> = names().collect();
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(v, sorted);
        assert!(v.contains(&"fault"));
    }
}
