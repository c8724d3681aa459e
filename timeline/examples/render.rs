//! Renders a timeline JSON file (`hqdmux timeline -o t.json`, `hqdmux sim
//! --timeline t.json`) as SVG and prints its size:
//! `cargo run -p hqdmux-timeline --example render -- IN.json OUT.svg [WIDTH] [TITLE]`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(output)) = (args.first(), args.get(1)) else {
        eprintln!("usage: render IN.json OUT.svg [WIDTH] [TITLE]");
        return ExitCode::from(2);
    };
    let width = match args.get(2).map(|w| w.parse::<u32>()) {
        None => 1200,
        Some(Ok(w)) => w,
        Some(Err(e)) => {
            eprintln!("render: WIDTH: {e}");
            return ExitCode::from(2);
        }
    };
    let t = match std::fs::read_to_string(input)
        .map_err(|e| e.to_string())
        .and_then(|s| timeline::Timeline::from_json(&s).map_err(|e| e.to_string()))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("render: {input}: {e}");
            return ExitCode::from(1);
        }
    };
    let svg = timeline::render_svg(
        &t,
        &timeline::RenderOptions {
            width,
            title: args.get(3).cloned(),
            ..Default::default()
        },
    );
    if let Err(e) = std::fs::write(output, &svg) {
        eprintln!("render: {output}: {e}");
        return ExitCode::from(1);
    }
    println!(
        "{output}: {} bytes ({} VMs, {} spans, {} preemptions, {} waits, {} changes)",
        svg.len(),
        t.vms.len(),
        t.spans.len(),
        t.preemptions.len(),
        t.waits.len(),
        t.marks.len()
    );
    ExitCode::SUCCESS
}
