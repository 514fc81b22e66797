//! search-rs: one JSON intent on stdin, one JSON result on stdout.
//!
//! Searches the `.txt` and `.md` files of the `corpus/` folder next to the
//! agent for the words of the intent text (case-insensitive, words of three
//! letters or more, common words ignored). Lines matching more distinct words
//! rank first; ties keep file and line order, so answers are deterministic.

mod json;

use std::env;
use std::fs;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

const MAX_MATCHES: usize = 10;
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "how", "what", "when", "where", "which",
    "who", "why", "with", "this", "that", "from", "into", "about", "does", "find", "search", "look", "show", "tell",
];

struct Hit {
    score: usize,
    source: String,
    line: String,
}

/// corpus/ in the working directory (the daemon runs agents in their manifest folder),
/// else next to the package the binary was built in (target/release/search-rs -> ../../corpus).
fn corpus_dir() -> Option<PathBuf> {
    let cwd = PathBuf::from("corpus");
    if cwd.is_dir() {
        return Some(cwd);
    }
    let exe = env::current_exe().ok()?;
    let package = exe.parent()?.parent()?.parent()?;
    let dir = package.join("corpus");
    if dir.is_dir() {
        Some(dir)
    } else {
        None
    }
}

fn terms(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let w = word.to_lowercase();
        if w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()) && !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

fn search(dir: &Path, words: &[String]) -> io::Result<Vec<Hit>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("txt") | Some("md")))
        .collect();
    files.sort();
    let mut hits = Vec::new();
    for file in files {
        let text = match fs::read_to_string(&file) {
            Ok(t) => t,
            Err(_) => continue, // not UTF-8 or unreadable: not part of the searchable corpus
        };
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let score = words.iter().filter(|w| lower.contains(w.as_str())).count();
            if score > 0 {
                hits.push(Hit { score, source: format!("corpus/{}:{}", name, number + 1), line: line.trim().to_string() });
            }
        }
    }
    hits.sort_by(|a, b| b.score.cmp(&a.score)); // stable: ties keep file and line order
    hits.truncate(MAX_MATCHES);
    Ok(hits)
}

fn reply(intent_id: Option<&str>, status: &str, text: &str, sources: &[String]) -> String {
    let id = intent_id.map(json::quote).unwrap_or_else(|| "null".to_string());
    let sources: Vec<String> = sources.iter().map(|s| json::quote(s)).collect();
    format!(
        "{{\"intent_id\":{},\"status\":{},\"text\":{},\"sources\":[{}]}}",
        id,
        json::quote(status),
        json::quote(text),
        sources.join(",")
    )
}

fn answer(line: &str) -> String {
    let intent = match json::parse(line.trim_end_matches(['\n', '\r'])) {
        Ok(json::Value::Object(map)) => map,
        Ok(_) => return reply(None, "error", "bad intent: expected a JSON object", &[]),
        Err(e) => return reply(None, "error", &format!("bad intent: {}", e), &[]),
    };
    let id = match intent.get("id") {
        Some(json::Value::Str(s)) => s.as_str(),
        _ => return reply(None, "error", "bad intent: id must be a string", &[]),
    };
    let text = match intent.get("text") {
        Some(json::Value::Str(s)) => s.as_str(),
        _ => return reply(Some(id), "error", "bad intent: text must be a string", &[]),
    };
    let words = terms(text);
    if words.is_empty() {
        return reply(Some(id), "error", "nothing to search for: use words of three letters or more", &[]);
    }
    let dir = match corpus_dir() {
        Some(d) => d,
        None => return reply(Some(id), "error", "corpus/ folder not found", &[]),
    };
    match search(&dir, &words) {
        Err(e) => reply(Some(id), "error", &format!("cannot read corpus/: {}", e), &[]),
        Ok(hits) if hits.is_empty() => reply(Some(id), "ok", &format!("no lines match {}", words.join(" ")), &[]),
        Ok(hits) => {
            let mut text = format!("{} matching line(s) for {}:", hits.len(), words.join(" "));
            for h in &hits {
                text.push_str(&format!("\n{}: {}", h.source, h.line));
            }
            let sources: Vec<String> = hits.iter().map(|h| h.source.clone()).collect();
            reply(Some(id), "ok", &text, &sources)
        }
    }
}

fn main() {
    let mut line = String::new();
    if let Err(e) = io::stdin().lock().read_line(&mut line) {
        eprintln!("search-rs: cannot read stdin: {}", e);
    }
    let out = answer(&line);
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "{}", out);
}
