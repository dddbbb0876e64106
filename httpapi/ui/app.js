// The operator page: every value from the API is rendered with textContent,
// never as HTML. Each API error is shown as its one-line "error".
'use strict';

const PAGE = 100;
const $ = (id) => document.getElementById(id);

// skew is the server's clock less this browser's, from the Date header of
// the last answer (to the second): "scheduled" and "ago" are the server's
// view, not that of an operator's laptop whose clock is off.
let skew = 0;
const now = () => Date.now() + skew;

// api calls /v1 with the page's own credentials (the key as basic-auth
// password); a non-2xx answer becomes an Error carrying the body's "error".
async function api(method, path) {
  let resp;
  try {
    resp = await fetch(path, { method, credentials: 'same-origin', headers: { Accept: 'application/json' } });
  } catch (e) {
    throw new Error(method + ' ' + path + ': ' + e.message);
  }
  const served = Date.parse(resp.headers.get('Date'));
  if (!isNaN(served)) skew = served - Date.now();
  if (resp.status === 204) return null;
  let body = null;
  try { body = await resp.json(); } catch (e) { /* not JSON: named below */ }
  if (!resp.ok) {
    const msg = body && typeof body.error === 'string' ? body.error : 'HTTP ' + resp.status + ' ' + resp.statusText;
    throw new Error(msg);
  }
  return body;
}

function showError(id, err) {
  const el = $(id);
  el.textContent = err ? String(err.message || err) : '';
  el.hidden = !err;
}

function notice(text) {
  const el = $('notice');
  el.textContent = text;
  el.hidden = !text;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v != null) q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
}

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text == null ? '' : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

// ago is how long ago (or until when) the time t is, in the largest unit.
function ago(t) {
  const ms = Date.parse(t);
  if (!t || isNaN(ms)) return t ? String(t) : '';
  const d = Math.round((now() - ms) / 1000);
  const a = Math.abs(d);
  const span = a < 90 ? a + ' s' : a < 5400 ? Math.round(a / 60) + ' min' : a < 172800 ? Math.round(a / 3600) + ' h' : Math.round(a / 86400) + ' d';
  return d >= 0 ? span + ' ago' : 'in ' + span;
}

// utc is t as "2026-12-01 08:31:42Z".
function utc(t) {
  const ms = Date.parse(t);
  if (!t || isNaN(ms)) return '';
  return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

// timeCell shows how long ago, and below it the time as the API gave it.
function timeCell(tr, t) {
  const td = cell(tr, '', 'time');
  if (!t) return td;
  const rel = document.createElement('span');
  rel.textContent = ago(t);
  const abs = document.createElement('span');
  abs.className = 'abs';
  abs.textContent = utc(t);
  td.append(rel, abs);
  return td;
}

function button(label, cls, onclick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'btn ' + cls;
  b.textContent = label;
  b.addEventListener('click', onclick);
  return b;
}

// ---- stuck steps ----

// cancelled holds the ids of the steps this page cancelled (DELETE
// answered 204). Such a step is listed by GET /v1/steps until the worker
// collects it, which is later (the api hands collection to the queue), so
// a listing right after the cancel still has it: the page leaves those out
// instead of showing a step the operator has just cancelled. No enrollment
// can be added to an existing step, so once cancelled it never becomes
// stuck again, and step ids are not reused.
const steps = { after: '', next: '', selected: null, outNext: '', asked: 0, cancelled: new Set() };

// scheduled reports whether step st waits on purpose: its not_until is
// still ahead, so its commands have not been sent to any device yet.
//
// Such a step is not stuck. At 3 a.m. the stuck table must hold only what
// may need a hand, so a scheduled step is never in it, nor counted for its
// "no stuck steps" line. It is not dropped from the page either, which
// would leave an operator who looks for it wondering where it went: the
// same page of the listing shows it in a table of its own, "scheduled for"
// its time, where it can still be opened and cancelled. (A step whose
// not_until has passed was sent, and is listed as stuck like any other.)
function scheduled(st) {
  const ms = Date.parse(st.not_until);
  return !isNaN(ms) && ms > now();
}

function stepRow(st) {
  const tr = document.createElement('tr');
  tr.dataset.stepId = String(st.step_id);
  if (steps.selected && String(steps.selected.step_id) === tr.dataset.stepId) tr.className = 'selected';
  cell(tr, st.step_id, 'id');
  cell(tr, st.workflow_name, 'mono');
  cell(tr, st.instance_id, 'mono');
  cell(tr, st.step_name);
  timeCell(tr, st.created_at);
  timeCell(tr, st.not_until);
  timeCell(tr, st.timeout);
  cell(tr, st.ids, 'num');
  cell(tr, st.outstanding_ids, 'num');
  tr.addEventListener('click', () => selectStep(st));
  return tr;
}

// stepRows is every row of both step tables.
function stepRows() {
  return [...$('steps').tBodies[0].rows, ...$('scheduled').tBodies[0].rows];
}

// showStepsEmpty says "no stuck steps" when the stuck table is empty, and
// shows the scheduled table only when it has a row.
function showStepsEmpty() {
  $('steps-empty').hidden = $('steps').tBodies[0].rows.length > 0;
  $('scheduled-section').hidden = $('scheduled').tBodies[0].rows.length === 0;
}

async function loadSteps() {
  const stuck = $('steps').tBodies[0];
  const waiting = $('scheduled').tBodies[0];
  // An answer to an older question (the age changed, a page turned) must
  // not overwrite the newer one's rows.
  const asked = ++steps.asked;
  try {
    const body = await api('GET', '/v1/steps' + query({ older_than: $('age').value, limit: PAGE, after: steps.after }));
    if (asked !== steps.asked) return;
    showError('steps-error', null);
    stuck.replaceChildren();
    waiting.replaceChildren();
    for (const st of body.steps || []) {
      if (steps.cancelled.has(String(st.step_id))) continue;
      (scheduled(st) ? waiting : stuck).appendChild(stepRow(st));
    }
    showStepsEmpty();
    steps.next = body.next || '';
    $('steps-next').disabled = !steps.next;
    $('steps-first').disabled = !steps.after;
  } catch (e) {
    if (asked === steps.asked) showError('steps-error', e);
  }
}

async function selectStep(st) {
  steps.selected = st;
  steps.outNext = '';
  for (const tr of stepRows()) tr.classList.toggle('selected', tr.dataset.stepId === String(st.step_id));
  $('detail-id').textContent = String(st.step_id);
  $('detail-what').textContent = [st.workflow_name, st.instance_id, st.step_name].filter(Boolean).join(' · ');
  $('outstanding').replaceChildren();
  $('step-detail').hidden = false;
  await loadOutstanding();
}

async function loadOutstanding() {
  const st = steps.selected;
  if (!st) return;
  const path = '/v1/steps/' + encodeURIComponent(String(st.step_id)) + '/outstanding' + query({ limit: PAGE, after: steps.outNext });
  try {
    const body = await api('GET', path);
    showError('detail-error', null);
    for (const id of body.ids || []) {
      const li = document.createElement('li');
      li.textContent = String(id);
      $('outstanding').appendChild(li);
    }
    steps.outNext = body.next || '';
    $('outstanding-more').hidden = !steps.outNext;
  } catch (e) {
    showError('detail-error', e);
  }
}

async function cancelStep() {
  const st = steps.selected;
  if (!st) return;
  const id = String(st.step_id);
  if (!confirm('Cancel step ' + id + ' for every enrollment that still holds it (' + st.outstanding_ids + ' outstanding)? No event is sent for a cancelled step.')) return;
  try {
    await api('DELETE', '/v1/steps/' + encodeURIComponent(id));
  } catch (e) {
    // not cancelled (or not known to be): the row stays, with the reason
    showError('detail-error', e);
    return;
  }
  // Cancelled: its row goes now, and stays gone from the listings that
  // follow while the step waits to be collected (see steps.cancelled).
  steps.cancelled.add(id);
  for (const tr of stepRows()) if (tr.dataset.stepId === id) tr.remove();
  showStepsEmpty();
  showError('detail-error', null);
  notice('Step ' + id + ' cancelled.');
  if (steps.selected === st) {
    steps.selected = null;
    $('step-detail').hidden = true;
  }
  await loadSteps();
}

// ---- failing and held events ----

const events = { held: { after: '', next: '' }, failing: { after: '', next: '' } };

async function loadEvents(state) {
  const tbody = $(state).tBodies[0];
  const page = events[state];
  try {
    const body = await api('GET', '/v1/events' + query({ state, limit: PAGE, after: page.after }));
    showError(state + '-error', null);
    tbody.replaceChildren();
    for (const ev of body.events || []) {
      const tr = document.createElement('tr');
      tr.dataset.eventId = String(ev.event_id);
      cell(tr, ev.event_id, 'id');
      cell(tr, ev.type, 'mono');
      cell(tr, ev.step_id, 'id');
      cell(tr, ev.enrollment_id, 'mono');
      timeCell(tr, ev.created_at);
      cell(tr, ev.attempts, 'num');
      cell(tr, ev.last_error, 'wrap mono');
      if (ev.state === 'held') cell(tr, 'held', 'state-held'); else timeCell(tr, ev.next_attempt_at);
      const td = document.createElement('td');
      td.appendChild(button('Deliver again', 'primary', () => deliver(ev, state)));
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    $(state + '-empty').hidden = tbody.rows.length > 0;
    page.next = body.next || '';
    $(state + '-next').hidden = !page.next;
  } catch (e) {
    showError(state + '-error', e);
  }
}

async function deliver(ev, state) {
  const id = String(ev.event_id);
  try {
    await api('POST', '/v1/events/' + encodeURIComponent(id) + '/deliver');
    showError(state + '-error', null);
    notice('Event ' + id + ' will be delivered again now.');
    await Promise.all([loadEvents('held'), loadEvents('failing')]);
  } catch (e) {
    showError(state + '-error', e);
  }
}

// ---- delivery ----

async function loadDelivery(path, method) {
  try {
    const body = await api(method || 'GET', path || '/v1/delivery');
    showError('delivery-error', null);
    const d = body && typeof body.paused === 'boolean' ? body : await api('GET', '/v1/delivery');
    const state = $('delivery-state');
    state.textContent = d.paused ? 'paused' : 'running';
    state.className = d.paused ? 'state-paused' : 'state-running';
    $('delivery-since').textContent = d.since ? 'since ' + utc(d.since) + ' (' + ago(d.since) + ')' : '';
    $('pause').disabled = d.paused;
    $('resume').disabled = !d.paused;
  } catch (e) {
    showError('delivery-error', e);
  }
}

function refresh() {
  notice('');
  steps.after = '';
  events.held.after = '';
  events.failing.after = '';
  loadDelivery();
  loadSteps();
  if (steps.selected) { steps.outNext = ''; $('outstanding').replaceChildren(); loadOutstanding(); }
  loadEvents('held');
  loadEvents('failing');
}

document.addEventListener('DOMContentLoaded', () => {
  $('age').addEventListener('change', () => { steps.after = ''; loadSteps(); });
  $('steps-next').addEventListener('click', () => { steps.after = steps.next; loadSteps(); });
  $('steps-first').addEventListener('click', () => { steps.after = ''; loadSteps(); });
  $('outstanding-more').addEventListener('click', loadOutstanding);
  $('cancel-step').addEventListener('click', cancelStep);
  for (const state of ['held', 'failing']) {
    $(state + '-next').addEventListener('click', () => { events[state].after = events[state].next; loadEvents(state); });
  }
  $('pause').addEventListener('click', () => {
    if (confirm('Pause delivery by every worker? Events wait in the outbox until resumed.')) loadDelivery('/v1/delivery/pause', 'POST');
  });
  $('resume').addEventListener('click', () => loadDelivery('/v1/delivery/resume', 'POST'));
  $('refresh').addEventListener('click', refresh);
  refresh();
});
