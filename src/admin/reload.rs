//! `POST /admin/reload`: asks the daemon to read its configuration again, as SIGHUP
//! does, and answers what came of it. The daemon does the reload and journals it
//! (`daemon/flow.rs`): one place for a reload however it is asked.

use std::net::IpAddr;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use tokio::sync::{mpsc, oneshot};

use super::AdminState;
use crate::api::{error, Reloaded};

/// A reload asked of the daemon: by whom (`SIGHUP`, or an admin token's name), from
/// where, and where to send what came of it.
pub(crate) struct Request {
    pub(crate) by: String,
    pub(crate) from: Option<IpAddr>,
    pub(crate) answer: oneshot::Sender<Answer>,
}

/// What came of a reload: in force, or why nothing changed.
pub(crate) type Answer = Result<Reloaded, String>;

/// Where the admin API sends its reloads: the daemon's queue of them.
#[derive(Clone)]
pub(crate) struct Reloads(mpsc::Sender<Request>);

impl Reloads {
    /// A queue of reloads and its receiving end, which the daemon reads.
    pub(crate) fn channel() -> (Self, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel(8);
        (Self(tx), rx)
    }

    /// Asks for a reload and waits for what came of it.
    pub(crate) async fn ask(&self, by: &str, from: Option<IpAddr>) -> Answer {
        let (answer, came) = oneshot::channel();
        let request = Request { by: by.to_owned(), from, answer };
        if self.0.send(request).await.is_err() {
            return Err("the relay is stopping: nothing was reloaded".into());
        }
        came.await.unwrap_or_else(|_| Err("the relay is stopping: nothing was reloaded".into()))
    }
}

/// Reads the configuration again (the file the relay was started with) and puts it in
/// force, or answers 409 with why nothing changed.
pub(super) async fn reload(state: web::Data<AdminState>, who: super::Who) -> HttpResponse {
    match state.reloads.ask(&who.name, who.from).await {
        Ok(reloaded) => HttpResponse::Ok().json(reloaded),
        Err(why) => error(StatusCode::CONFLICT, why),
    }
}
