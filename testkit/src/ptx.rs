//! The PTX `.entry` reader (`hwqueue::ptx`) against PTX rendered from a
//! known parameter list.

use hwqueue::ptx;

/// The PTX types the renderer picks from, with their sizes.
const TYPES: &[(&str, usize)] = &[
    (".u8", 1),
    (".s16", 2),
    (".f16", 2),
    (".b32", 4),
    (".f32", 4),
    (".u64", 8),
    (".f64", 8),
    (".b128", 16),
];

/// Runs the reader over `data` two ways:
///
/// - `data` as text (lossily UTF-8), for an entry named `k`: it never
///   panics, and (where the text has no comment marks) whatever it accepts
///   it accepts again with comments added around every comma.
/// - `data` as a parameter list: each pair of bytes picks a type, an array
///   length, an alignment, `.ptr` attributes and spacing; the list is
///   rendered as NVRTC-style PTX beside a decoy entry and comments, and the
///   reader must give back exactly each parameter's size.
///
/// # Panics
/// On a mismatch, or if the reader panics.
pub fn ptx_params(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let parsed = ptx::entry_params(&text, "k");
    // Comments added around every comma (of a text with no comment marks
    // of its own, whose commas might sit inside a comment) change nothing.
    if let (Ok(sizes), false) = (parsed, text.contains(['/', '*'])) {
        let commented = text.replace(',', "/* , */ , // ,\n");
        if let Ok(again) = ptx::entry_params(&commented, "k") {
            assert_eq!(sizes, again, "comments changed the parameters of {text:?}");
        }
    }
    let _ = ptx::isa_version(&text);

    let mut expected = Vec::new();
    let mut params = Vec::new();
    for (index, pair) in data.chunks_exact(2).take(64).enumerate() {
        let (kind, shape) = (pair[0], pair[1]);
        let (ty, size) = TYPES[usize::from(kind) % TYPES.len()];
        let count = usize::from(shape % 4) + 1;
        let mut words = vec![".param".to_owned()];
        if shape & 0x10 != 0 {
            words.push(format!(".align {}", 1usize << (shape >> 5)));
        }
        words.push(ty.to_owned());
        if shape & 0x04 != 0 {
            words.push(".ptr .global .align 8".to_owned());
        }
        let array = if count > 1 || shape & 0x08 != 0 {
            if kind & 0x80 != 0 {
                format!(" [ {count} ]")
            } else {
                format!("[{count}]")
            }
        } else {
            String::new()
        };
        words.push(format!("k_param_{index}{array}"));
        let separator = if kind & 0x40 != 0 { "\n\t" } else { " " };
        params.push(words.join(separator));
        expected.push(size * if array.is_empty() { 1 } else { count });
    }
    let rendered = format!(
        ".version 8.8\n.target sm_90\n// .entry k(.param .u32 decoy)\n\
         .visible .entry kk(.param .u8 other)\n{{ ret; }}\n\
         .visible .entry k(\n\t{}\n)\n.maxntid 128, 1, 1\n{{\n\tret;\n}}\n",
        params.join(",\n\t")
    );
    match ptx::entry_params(&rendered, "k") {
        Ok(sizes) => assert_eq!(sizes, expected, "{rendered}"),
        Err(error) => panic!("{error}\n{rendered}"),
    }
    assert_eq!(ptx::isa_version(&rendered), Some((8, 8)));
}
