// callstream dashboard: copy buttons and the live-call feed. No dependencies.
"use strict";

function copyButtons() {
  for (const button of document.querySelectorAll("button.copy")) {
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.dataset.copy);
      const text = source ? source.textContent : "";
      try {
        await navigator.clipboard.writeText(text);
      } catch (_) {
        const range = document.createRange();
        range.selectNodeContents(source);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        document.execCommand("copy");
      }
      button.textContent = "Copied";
      setTimeout(() => { button.textContent = "Copy"; }, 1500);
    });
  }
}

function clock(seconds) {
  const s = Math.max(0, seconds);
  const m = Math.floor(s / 60);
  return String(m).padStart(2, "0") + ":" + (s % 60).toFixed(1).padStart(4, "0");
}

function liveCalls() {
  const root = document.getElementById("calls");
  if (!root) return;
  const status = document.getElementById("live-status");
  const calls = new Map();

  function speaker(call, channel) {
    const leg = call.channels[channel];
    return leg === "internal" ? "Agent" : leg === "external" ? "Customer" : "Channel " + channel;
  }

  function line(call, l) {
    const li = document.createElement("li");
    const t = document.createElement("span");
    t.className = "t";
    t.textContent = clock(l.offset);
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = speaker(call, l.channel) + ":";
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = l.text;
    li.append(t, who, text);
    return li;
  }

  function render() {
    root.replaceChildren();
    if (calls.size === 0) {
      const p = document.createElement("p");
      p.id = "no-calls";
      p.textContent = "No calls in progress.";
      root.append(p);
      return;
    }
    for (const call of calls.values()) {
      const section = document.createElement("section");
      section.className = "call";
      section.id = "call-" + call.call_id;
      const h = document.createElement("h2");
      h.textContent = "Conversation " + call.conversation_id + " · since " + call.started_at.slice(11, 19) + " UTC";
      if (call.record_id) {
        const a = document.createElement("a");
        a.className = "record-link";
        a.href = "/dashboard/history/" + encodeURIComponent(call.record_id);
        a.textContent = "Open call page";
        h.append(" ", a);
      }
      const ol = document.createElement("ol");
      ol.setAttribute("aria-label", "Transcript");
      for (const l of call.lines) ol.append(line(call, l));
      section.append(h, ol);
      root.append(section);
    }
  }

  function load(list) {
    calls.clear();
    for (const c of list) calls.set(c.call_id, c);
    render();
  }

  load(JSON.parse(root.dataset.initial || "[]"));
  const source = new EventSource("/dashboard/calls/events");
  source.onopen = () => { status.textContent = "Live."; };
  source.onerror = () => { status.textContent = "Reconnecting…"; };
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "snapshot") {
      load(event.calls);
    } else if (event.type === "reload") {
      source.close();
      location.reload();
    } else if (event.type === "opened") {
      calls.set(event.call.call_id, event.call);
      render();
    } else if (event.type === "transcript") {
      const call = calls.get(event.call_id);
      if (!call) return;
      call.lines.push(event.line);
      const ol = document.querySelector("#call-" + CSS.escape(event.call_id) + " ol");
      if (ol) {
        ol.append(line(call, event.line));
        ol.scrollTop = ol.scrollHeight;
      } else {
        render();
      }
    } else if (event.type === "ended") {
      calls.delete(event.call_id);
      render();
    } else if (event.type === "refused") {
      const refused = document.getElementById("refused");
      if (!refused) return;
      const count = Number(refused.dataset.count || "0") + 1;
      refused.dataset.count = String(count);
      refused.querySelector(".n").textContent = String(count);
      refused.querySelector(".last").textContent = ", the last at " + event.at.slice(11, 19) + " UTC";
    }
  };
}

// A call page while the call streams: the page is fetched again every few seconds and its
// conversation, intents and details replaced, until the call has ended.
function liveRecord() {
  const root = document.getElementById("record");
  if (!root || root.dataset.live !== "1") return;
  const parts = ["record-meta", "conversation", "intents"];
  async function refresh() {
    try {
      const response = await fetch(location.pathname, { credentials: "same-origin" });
      if (!response.ok) return;
      const next = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const id of parts) {
        const mine = document.getElementById(id);
        const theirs = next.getElementById(id);
        if (mine && theirs) mine.replaceWith(document.importNode(theirs, true));
      }
      const done = next.getElementById("record");
      if (done && done.dataset.live !== "1") {
        root.dataset.live = "0";
        clearInterval(timer);
      }
    } catch (_) {
      // Try again at the next tick.
    }
  }
  const timer = setInterval(refresh, 3000);
}

document.addEventListener("DOMContentLoaded", () => {
  copyButtons();
  liveCalls();
  liveRecord();
});
