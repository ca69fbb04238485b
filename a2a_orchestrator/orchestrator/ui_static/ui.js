// The web view's live updates: one EventSource per page, and stop buttons.
// Everything a stream sends is written with textContent, never as markup:
// child text is untrusted. No framework, no build step.
"use strict";

(function () {
  const body = document.body;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const live = document.getElementById("live");
  const notice = document.getElementById("notice");

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function link(href, text, code) {
    const a = el("a");
    a.href = href;
    if (code) a.appendChild(el("code", text));
    else a.textContent = text;
    return a;
  }

  function say(text) {
    if (notice) notice.textContent = text;
  }

  const RUNNING = ["running", "input_required"];

  // -- stop buttons -------------------------------------------------------------

  async function stop(button) {
    button.disabled = true;
    say("stopping…");
    try {
      const response = await fetch(button.dataset.stop, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf, Accept: "application/json" },
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) {
        say("stop refused: " + (answer.detail || response.status));
        button.disabled = false;
        return;
      }
      if ("stopped" in answer && typeof answer.stopped === "number") {
        say(answer.stopped + " stopped");
      } else {
        say(answer.stopped ? "stopped" : "nothing was running");
      }
    } catch (error) {
      say("stop failed: " + error);
      button.disabled = false;
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-stop]");
    if (button) stop(button);
  });

  // -- questions: a box to answer each one the session's run waits on --------------

  async function answer(form) {
    const text = form.elements.answer.value.trim();
    if (!text) return;
    const button = form.querySelector("button");
    button.disabled = true;
    say("answering…");
    try {
      const response = await fetch(form.dataset.answer, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf, Accept: "application/json",
          "Content-Type": "application/json" },
        body: JSON.stringify({ answer: text }),
      });
      const reply = await response.json().catch(() => ({}));
      if (!response.ok) {
        say("answer refused: " + (reply.detail || response.status));
        button.disabled = false;
        return;
      }
      say("answered");
      form.remove();
    } catch (error) {
      say("answer failed: " + error);
      button.disabled = false;
    }
  }

  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-answer]");
    if (!form) return;
    event.preventDefault();
    answer(form);
  });

  function questions(asked) {
    const section = document.getElementById("questions");
    const session = section.dataset.sessionId;
    const ids = asked.map((q) => q.id);
    // Forms of questions still asked stay as they are (with what is typed in them).
    section.querySelectorAll("form[data-question-id]").forEach((form) => {
      if (!ids.includes(form.dataset.questionId)) form.remove();
    });
    asked.forEach((q) => {
      if (section.querySelector('form[data-question-id="' + CSS.escape(q.id) + '"]')) return;
      const form = el("form", undefined, "question");
      form.dataset.questionId = q.id;
      form.dataset.answer = "/ui/sessions/" + encodeURIComponent(session) + "/questions/" +
        encodeURIComponent(q.id);
      const line = el("p");
      line.append(el("strong", q.who, "who"), " asks: ", el("span", q.text, "text"));
      const box = el("textarea");
      box.name = "answer";
      box.rows = 2;
      box.required = true;
      box.setAttribute("aria-label", "your answer");
      const button = el("button", "Answer");
      button.type = "submit";
      form.append(line, box, button);
      section.appendChild(form);
    });
    section.hidden = asked.length === 0;
  }

  // -- pages --------------------------------------------------------------------

  function sessionsRows(sessions) {
    const tbody = document.querySelector("#sessions tbody");
    tbody.replaceChildren(
      ...sessions.map((s) => {
        const tr = el("tr");
        tr.dataset.sessionId = s.id;
        const task = el("td", undefined, "task");
        task.appendChild(link("/ui/sessions/" + encodeURIComponent(s.id), s.title || s.id));
        const id = el("div", undefined, "hint");
        id.appendChild(el("code", s.id));
        task.appendChild(id);
        const signal = el("td", s.signal, "signal");
        signal.dataset.signal = s.signal;
        signal.appendChild(el("div", s.ending, "hint"));
        tr.append(task, signal, el("td", s.created), el("td", s.elapsed, "num"),
          el("td", s.children, "num"), el("td", s.counts), el("td", s.tokens, "num"));
        return tr;
      })
    );
    document.getElementById("no-sessions").hidden = sessions.length > 0;
  }

  function treeRows(rows) {
    const table = document.getElementById("tree");
    const session = table.dataset.sessionId;
    const base = "/ui/sessions/" + encodeURIComponent(session);
    table.tBodies[0].replaceChildren(
      ...rows.map((r) => {
        const tr = el("tr");
        tr.dataset.childId = r.child_id;
        tr.dataset.state = r.state;
        const agent = el("td", undefined, "agent depth-" + Math.min(r.depth, 8));
        if (r.link) agent.appendChild(link(base + "/children/" + encodeURIComponent(r.link), r.agent));
        else agent.textContent = r.agent;
        const id = el("td");
        id.appendChild(el("code", r.child_id.slice(0, 8)));
        const action = el("td");
        if (r.child_id && RUNNING.includes(r.state)) {
          const button = el("button", "Stop", "stop");
          button.type = "button";
          button.dataset.stop =
            "/api/sessions/" + encodeURIComponent(session) + "/children/" +
            encodeURIComponent(r.child_id) + "/stop";
          action.appendChild(button);
        }
        tr.append(agent, el("td", r.role), id, el("td", r.transport),
          el("td", r.status, "status"), el("td", r.last, "last"),
          el("td", r.input_tokens + " / " + r.output_tokens, "num"),
          el("td", r.elapsed, "num"), action);
        return tr;
      })
    );
    document.getElementById("no-children").hidden = rows.length > 0;
  }

  function childState(state) {
    const status = document.getElementById("status");
    status.textContent = state.status;
    status.dataset.state = state.state;
    document.getElementById("tokens").textContent =
      state.input_tokens + " / " + state.output_tokens;
    document.getElementById("result").textContent = state.result;
    const stopChild = document.getElementById("stop-child"); // none on the root's page
    if (stopChild) stopChild.hidden = !RUNNING.includes(state.state);
  }

  function told(session) {
    document.getElementById("task").textContent = session.title || "(no task recorded)";
    document.getElementById("outcome").dataset.signal = session.signal;
    document.getElementById("signal").textContent = session.signal;
    document.getElementById("elapsed").textContent = session.elapsed;
    document.getElementById("total").textContent =
      session.input_tokens + " / " + session.output_tokens;
    const ending = session.failure || session.answer;
    const label = document.getElementById("ending-label");
    label.textContent = session.failure ? "Failure" : "Final answer";
    label.hidden = !ending;
    const text = document.getElementById("ending");
    text.textContent = ending;
    text.hidden = !ending;
  }

  function logLine(line) {
    const tbody = document.querySelector("#log tbody");
    if (tbody.querySelector('tr[data-seq="' + Number(line.seq) + '"]')) return;
    const tr = el("tr");
    tr.dataset.seq = line.seq;
    const cell = el("td");
    cell.appendChild(el("div", line.summary, "summary"));
    if (line.detail) {
      const details = el("details");
      details.append(el("summary", "full text"), el("pre", line.detail));
      cell.appendChild(details);
    }
    tr.append(el("td", line.seq, "num"), el("td", line.time), el("td", line.kind), cell);
    tbody.appendChild(tr);
  }

  // -- the stream ---------------------------------------------------------------

  const url = body.dataset.stream;
  if (!url || !window.EventSource) {
    if (live) live.textContent = "";
    return;
  }
  const source = new EventSource(url + "?after=" + encodeURIComponent(body.dataset.after || "0"));
  source.onopen = () => {
    live.textContent = "live";
    live.className = "live on";
  };
  source.onerror = () => {
    // The browser reconnects by itself (sending Last-Event-ID) unless the
    // server refused the stream; then only a reload (or a login) helps.
    const closed = source.readyState === EventSource.CLOSED;
    live.textContent = closed ? "disconnected: reload" : "reconnecting…";
    live.className = "live off";
  };
  const on = (name, handle) =>
    source.addEventListener(name, (event) => handle(JSON.parse(event.data)));
  on("sessions", sessionsRows);
  on("tree", treeRows);
  on("questions", questions);
  on("told", told);
  on("child", childState);
  on("line", logLine);
})();
