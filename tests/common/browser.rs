//! A headless Chromium for the dashboard's tests: one `chromedriver` per test process
//! (started on a free port, in a process group of its own so that nothing it starts
//! outlives the test), one browser session reused by every step, and helpers that poll
//! the page with a deadline instead of sleeping.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long a page may take to show what a step waits for.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A browser session and the chromedriver behind it.
pub struct Browser {
    client: Option<Client>,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (as root here: no sandbox).
    pub async fn start() -> Browser {
        let (driver, port) = start_driver();
        let profile = tempfile::tempdir().expect("a browser profile folder");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--disable-extensions", "--window-size=1200,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a Chromium session");
        Browser {
            client: Some(client),
            driver,
            _profile: profile,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().expect("an open session")
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.c().goto(url).await.expect("navigate");
    }

    /// Opens the dashboard of `addr` at `hash` with `read` as the tab's read token.
    pub async fn open_with_token(&self, addr: &str, hash: &str, read: &str) {
        self.goto(&format!("http://{addr}/ui/app.css")).await;
        self.eval(&format!(
            "sessionStorage.setItem('artex.token', {read:?}); return null"
        ))
        .await;
        self.goto(&format!("http://{addr}/{hash}")).await;
    }

    /// Runs `script` (a function body; `return` a value) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.c()
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` until it returns something other than null or false; returns it.
    pub async fn until(&self, what: &str, script: &str) -> Value {
        let end = Instant::now() + PATIENCE;
        loop {
            let v = self.eval(script).await;
            if !v.is_null() && v != Value::Bool(false) {
                return v;
            }
            if Instant::now() > end {
                let text = self
                    .eval("return document.getElementById('main').innerText")
                    .await;
                let errors = self.eval("return window.A ? A.errors : null").await;
                panic!(
                    "timed out after {PATIENCE:?} waiting for {what}\npage: {}\nerrors: {errors}",
                    text.as_str().unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the element at `css` to be shown, then clicks it.
    pub async fn click(&self, css: &str) {
        self.until(
            &format!("{css} to be shown"),
            &format!(
                "const e = document.querySelector({css:?}); return !!e && e.offsetParent !== null && !e.disabled"
            ),
        )
        .await;
        self.c()
            .find(Locator::Css(css))
            .await
            .expect("element")
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the element at `css` (a file input takes a path).
    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self
            .c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        e.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Answers the page's token dialog (it must be open or about to open) with `token`.
    pub async fn give_token(&self, token: &str) {
        self.until(
            "the token dialog",
            "return document.getElementById('token-dialog').open",
        )
        .await;
        self.type_into("#token-input", token).await;
        self.click("#token-ok").await;
    }

    /// Confirms the page's confirmation dialog.
    pub async fn confirm(&self) {
        self.until(
            "the confirmation dialog",
            "return document.getElementById('confirm-dialog').open",
        )
        .await;
        self.click("#confirm-ok").await;
    }

    /// Asserts that nothing went wrong in the page: no uncaught error, no rejected
    /// promise left unhandled, no `console.error`, no Content-Security-Policy violation.
    pub async fn assert_no_errors(&self) {
        let errors = self.eval("return A.errors").await;
        assert_eq!(errors, json!([]), "the page logged errors");
    }

    /// Marks the page, so that [`Browser::finish_on_the_marked_page`] can tell that it
    /// was never reloaded since: what changed on it, changed live.
    pub async fn mark_page(&self) {
        self.eval("window.__same_page = true; return null").await;
    }

    /// Ends a test on the page marked by [`Browser::mark_page`]: it was not reloaded
    /// since, and it logged no error; then closes the session.
    pub async fn finish_on_the_marked_page(self) {
        assert_eq!(
            self.eval("return window.__same_page === true").await,
            json!(true),
            "the page was reloaded since it was marked"
        );
        self.assert_no_errors().await;
        self.close().await;
    }

    /// Ends the session (the browser exits), then chromedriver.
    pub async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }
}

/// How many times chromedriver is started before a test gives up on it.
const DRIVER_STARTS: usize = 3;

/// Starts chromedriver on a free port and returns it with that port. A chromedriver that
/// exits before it says its port (once in a CI run of 590 tests, with nothing to say why)
/// is started again, up to [`DRIVER_STARTS`] times; the panic then quotes what each said.
fn start_driver() -> (Child, String) {
    let mut said = Vec::new();
    for attempt in 1..=DRIVER_STARTS {
        let mut driver = Command::new("chromedriver")
            .arg("--port=0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("chromedriver must be installed (scripts/test.sh installs chromium-driver)");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the port from "… started successfully on port N.", and keeps every line
        // for the panic's message, until the pipe closes.
        let out = driver.stdout.take().expect("chromedriver's stdout");
        let err = driver.stderr.take().expect("chromedriver's stderr");
        let readers: Vec<_> = [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err),
        ]
        .into_iter()
        .map(|pipe| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut lines = Vec::new();
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if line.contains("successfully") {
                        if let Some(rest) = line.split("on port ").nth(1) {
                            let port = rest.chars().take_while(char::is_ascii_digit).collect();
                            let _ = tx.send(port);
                        }
                    }
                    lines.push(line);
                }
                lines
            })
        })
        .collect();
        drop(tx);
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(port) => return (driver, port),
            Err(e) => {
                let status = end_group(&mut driver);
                // The pipes close with the group: each reader ends with what it read.
                let lines: Vec<String> = readers
                    .into_iter()
                    .flat_map(|r| r.join().unwrap_or_default())
                    .collect();
                said.push(format!(
                    "start {attempt}: {e:?}, exit {status:?}, said: {lines:?}"
                ));
            }
        }
    }
    panic!(
        "chromedriver never said which port it listens on:\n{}",
        said.join("\n")
    );
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = end_group(&mut self.driver);
    }
}

/// Kills chromedriver's group and reaps chromedriver. The group is its own
/// (`process_group(0)` above): it and any browser process left behind, and nothing else.
fn end_group(driver: &mut Child) -> std::io::Result<std::process::ExitStatus> {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(driver.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    driver.wait()
}
