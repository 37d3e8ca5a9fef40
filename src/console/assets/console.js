// hookrelay console: a small client of the relay's own admin API (GET /admin/openapi.json).
// No framework and no build step; every value from the API is set as text, never as HTML.
'use strict';

// Who is signed in, as /console/session says: the CSRF token, the token's name, its
// role (viewer, operator, admin) and the destinations it is scoped to (null: all).
const session = { csrf: null, name: null, role: null, destinations: null };
const RANK = { viewer: 0, operator: 1, admin: 2 };

/** Whether the signed-in role is `role` or above (the API enforces it; this hides what it would refuse). */
function may(role) {
  return (RANK[session.role] ?? -1) >= RANK[role];
}

/** Takes a session answer: its CSRF token and who it is. */
function remember(data) {
  session.csrf = data.csrf || null;
  session.name = data.name || null;
  session.role = data.role || null;
  session.destinations = data.destinations || null;
  const who = document.getElementById('who');
  if (who) {
    const scope = session.destinations ? ' · ' + session.destinations.join(', ') : '';
    who.textContent = session.name ? 'Signed in as ' + session.name + ' (' + session.role + scope + ')' : '';
  }
}
let refresh = null;

// ---- DOM helpers -------------------------------------------------------------------

/** An element with attributes (`on*` functions become listeners) and children. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A time in the browser's zone, UTC on hover. */
function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return h('span', {}, iso);
  return h('time', { datetime: iso, title: iso.replace('T', ' ').replace(/\.\d+Z$/, 'Z') + ' UTC' },
    d.toLocaleString());
}

/** A state word as the API says it (`delivered`, `dead`, ...). */
function state(word, label) {
  return h('span', { class: 'state ' + word }, label || word);
}

/** The circuit breaker's phase, said as such (`closed` alone reads like "shut"). */
function circuit(phase) {
  return state(phase, 'circuit ' + String(phase).replace('_', '-'));
}

/** An RFC 3339 time as a `datetime-local` input's value, in the browser's zone. */
function localInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + 'T' + pad(d.getHours()) + ':' + pad(d.getMinutes());
}

// A queue's number, marked as a lower bound while the relay still counts the queue
// after a restart (a large backlog is counted behind the open).
function atLeast(queue, n) {
  return queue.counting ? h('span', { title: 'still counting after the restart' }, '≥ ' + n) : String(n);
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return '—';
  if (seconds < 90) return Math.round(seconds) + ' s';
  if (seconds < 5400) return Math.round(seconds / 60) + ' min';
  if (seconds < 172800) return (seconds / 3600).toFixed(1) + ' h';
  return (seconds / 86400).toFixed(1) + ' d';
}

function table(caption, headers, rows) {
  return h('div', { class: 'table-wrap', role: 'region', tabindex: 0, 'aria-label': caption },
    h('table', {},
      h('caption', { class: 'skip' }, caption),
      h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col', class: /^(Pending|Held|Retrying|Dead|In flight|Hooks|Not active|Triggered|Attempts|Per minute|Share|Stored|Missing|Duplicates|Rejected|Unauthorized|Closed|Count)$/.test(x) ? 'num' : null }, x)))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: headers.length, class: 'muted' }, 'none')))));
}

function link(href, ...text) {
  return h('a', { href, 'data-nav': true }, ...text);
}

function say(message) {
  const box = document.getElementById('status');
  box.textContent = message;
  box.hidden = false;
  clearTimeout(say.timer);
  say.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

/** Asks for confirmation in a modal dialog; resolves to true on Confirm. */
function confirmed(text, action) {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = action;
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.returnValue = 'cancel';
    dialog.showModal();
  });
}

function copyButton(label, text) {
  return h('button', { type: 'button', onclick: async () => {
    try { await navigator.clipboard.writeText(text); say(label + ' copied'); }
    catch (e) { say('copying failed: ' + e.message); }
  } }, 'Copy ' + label.toLowerCase());
}

// ---- the API ---------------------------------------------------------------------

class SignedOut extends Error {}

/** Calls the admin API with the session cookie (and the CSRF token on changes). */
async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET') headers['X-CSRF-Token'] = session.csrf || '';
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, {
    method, headers, credentials: 'same-origin', cache: 'no-store',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 401) throw new SignedOut();
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!resp.ok) throw new Error((data && data.error) || ('HTTP ' + resp.status));
  return data;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const s = q.toString();
  return s ? '?' + s : '';
}

// ---- pages ------------------------------------------------------------------------

function page(title, ...content) {
  const main = document.getElementById('main');
  main.replaceChildren(h('h1', {}, title), ...content.flat().filter((c) => c !== null && c !== undefined && c !== false));
  document.title = title + ' · hookrelay';
}

function failed(e) {
  if (e instanceof SignedOut) return signIn('Your session ended: sign in again.');
  page('Something went wrong', h('p', { class: 'error', role: 'alert' }, e.message));
}

function bytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : String(n)) + ' ' + units[i];
}

const SVG = 'http://www.w3.org/2000/svg';

/** A line of `values` over the last hour, with its latest value; described for screen readers. */
function sparkline(values, label, format) {
  const w = 160, ht = 32;
  const nums = values.map((v) => (v === null || v === undefined ? 0 : v));
  const max = Math.max(1, ...nums);
  const last = values.length ? values[values.length - 1] : null;
  const shown = (v) => (v === null || v === undefined ? '—' : format(v));
  const said = label + ': now ' + shown(last) + ', at most ' + shown(Math.max(0, ...nums)) + ' over the last hour';
  const svg = document.createElementNS(SVG, 'svg');
  for (const [k, v] of [['viewBox', '0 0 ' + w + ' ' + ht], ['width', w], ['height', ht], ['class', 'spark'], ['role', 'img'], ['aria-label', said]]) svg.setAttribute(k, v);
  const title = document.createElementNS(SVG, 'title');
  title.textContent = said;
  svg.append(title);
  const series = nums.length === 1 ? [nums[0], nums[0]] : nums;
  if (series.length > 1) {
    const points = series.map((v, i) => ((i * (w - 2)) / (series.length - 1) + 1).toFixed(1) + ',' + (ht - 1 - (v * (ht - 2)) / max).toFixed(1));
    const line = document.createElementNS(SVG, 'polyline');
    for (const [k, v] of [['points', points.join(' ')], ['fill', 'none'], ['stroke', 'currentColor'], ['stroke-width', '1.5']]) line.setAttribute(k, v);
    svg.append(line);
  }
  return h('span', { class: 'chart' }, svg, ' ', h('span', { class: 'num' }, shown(last)));
}

/** The last error, or that the destination has recovered from it. */
function lastError(d) {
  if (!d.last_error) return '—';
  if (d.recovered_at) return [state('ok', 'recovered'), ' ', time(d.recovered_at), h('span', { class: 'muted' }, ' from: ' + d.last_error)];
  return [h('span', { class: 'error' }, d.last_error), ' ', time(d.last_error_at)];
}

async function overview() {
  const [dests, hooks, ov, hist] = await Promise.all([
    api('GET', '/admin/destinations'), api('GET', '/admin/hooks'), api('GET', '/admin/overview'),
    api('GET', '/admin/destinations/history')]);
  const destRows = dests.destinations.map((d) => h('tr', {},
    h('th', { scope: 'row' }, d.name, ' ', h('span', { class: 'muted kind' }, d.kind)),
    h('td', {}, d.paused ? state('paused') : state('active'), ' ', circuit(d.circuit),
      d.circuit_since ? h('span', { class: 'muted' }, ' since ', time(d.circuit_since)) : null,
      ' ', d.stalled ? state('stalled', 'stalled (watchdog)') : null),
    h('td', { class: 'num' }, atLeast(d.queue, d.queue.pending)), h('td', { class: 'num' }, atLeast(d.queue, d.queue.held)),
    h('td', { class: 'num' }, atLeast(d.queue, d.queue.retrying)),
    h('td', { class: 'num' }, d.queue.dead ? link('/console/dead-letters' + query({ destination: d.name }), atLeast(d.queue, d.queue.dead)) : atLeast(d.queue, 0)),
    h('td', { class: 'num' }, d.in_flight), h('td', {}, age(d.oldest_age_seconds)),
    h('td', { class: 'num' }, d.deliveries_per_minute),
    h('td', {}, lastError(d))));
  const chartRows = hist.destinations.map((s) => h('tr', { 'data-destination': s.name },
    h('th', { scope: 'row' }, s.name),
    h('td', {}, sparkline(s.points.map((p) => p.backlog), s.name + ' backlog', String)),
    h('td', {}, sparkline(s.points.map((p) => p.oldest_pending_seconds), s.name + ' oldest pending', age)),
    h('td', {}, sparkline(s.points.map((p) => p.per_minute), s.name + ' deliveries per minute', String))));
  const sourceRows = ov.sources.map((x) => h('tr', {},
    h('th', { scope: 'row' }, x.source), h('td', { class: 'num' }, x.received),
    h('td', { class: 'num' }, x.duplicates), h('td', { class: 'num' }, x.rejected),
    h('td', { class: 'num' }, x.unauthorized), h('td', { class: 'num' }, x.closed)));
  const accountRows = hooks.accounts.map((a) => h('tr', {},
    h('th', { scope: 'row' }, a.source + ' / ' + a.account),
    h('td', {}, state(a.ok ? 'ok' : 'failing'), a.stale ? [' ', state('stale')] : null),
    h('td', {}, a.last_reconcile ? time(a.last_reconcile) : '—', a.age_seconds !== undefined ? h('span', { class: 'muted' }, ' (' + age(a.age_seconds) + ' ago)') : null),
    h('td', { class: 'num' }, a.hooks.length),
    h('td', { class: 'num' }, a.hooks.filter((x) => x.status !== 'Active').length),
    h('td', {}, a.errors.join('; ') || '—')));
  const st = ov.storage;
  const storage = h('dl', { class: 'facts' },
    h('dt', {}, 'Store'), h('dd', {}, st.backend + ' · ' + bytes(st.store_bytes)),
    st.free_bytes !== null ? [h('dt', {}, 'Free space'), h('dd', {}, bytes(st.free_bytes), ' (floor ', bytes(st.floor_bytes), ') ',
      st.below_floor ? state('dead', 'below the floor: callbacks refused') : state('ok', 'above the floor'))] : null,
    h('dt', {}, 'Relays alive'), h('dd', {}, ov.relays));
  page('Overview',
    h('p', { class: 'muted' }, 'Refreshes every 5 seconds. Counts are this relay\'s since it started.'),
    h('h2', {}, 'Destinations'),
    table('Destinations', ['Destination', 'State', 'Pending', 'Held', 'Retrying', 'Dead', 'In flight', 'Oldest pending', 'Per minute', 'Last error'], destRows),
    h('h2', {}, 'The last hour'),
    h('p', { class: 'muted' }, 'Sampled by this relay every ' + hist.interval_seconds + ' seconds since it started.'),
    table('The last hour', ['Destination', 'Backlog', 'Oldest pending', 'Deliveries per minute'], chartRows),
    h('h2', {}, 'Sources'),
    table('Sources', ['Source', 'Stored', 'Duplicates', 'Rejected', 'Unauthorized', 'Closed'], sourceRows),
    h('h2', {}, 'Upstream accounts'),
    table('Upstream accounts', ['Account', 'Status', 'Last reconcile', 'Hooks', 'Not active', 'Errors'], accountRows),
    h('h2', {}, 'Storage and fleet'), storage);
  refresh = setTimeout(() => render(true), 5000);
}

const STATUSES = ['', 'received', 'dispatched', 'duplicate', 'unrouted', 'rejected'];
const DELIVERY_STATES = ['', 'dead', 'retrying', 'held', 'pending', 'delivered', 'discarded', 'superseded', 'filtered'];

async function events() {
  const params = new URLSearchParams(location.search);
  const field = (name, label, hint) => h('label', {}, label,
    h('input', { name, value: params.get(name) || '', placeholder: hint || '', autocomplete: 'off' }));
  // Times: typed in the browser's zone, carried in the URL and to the API in UTC.
  const when = (name, label) => h('label', {}, label,
    h('input', { type: 'datetime-local', name, value: localInput(params.get(name)) }));
  const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    for (const k of ['since', 'until']) if (data[k]) data[k] = new Date(data[k]).toISOString();
    navigate('/console/events' + query(data));
  } },
  field('resource', 'Resource (type/id)', 'actions/5'), field('event', 'Event', 'ActionUpdated'),
  field('source', 'Source'), when('since', 'Received from'), when('until', 'Received before'),
  h('label', {}, 'Status', h('select', { name: 'status' },
    STATUSES.map((s) => h('option', { value: s, selected: params.get('status') === s }, s || 'any')))),
  h('label', {}, 'Deliveries', h('select', { name: 'delivery' },
    DELIVERY_STATES.map((s) => h('option', { value: s, selected: params.get('delivery') === s }, s ? 'worst: ' + s : 'any')))),
  h('button', { type: 'submit', class: 'primary' }, 'Search'));
  const filters = {};
  for (const k of ['resource', 'event', 'source', 'status', 'delivery', 'since', 'until', 'after']) if (params.get(k)) filters[k] = params.get(k);
  const data = await api('GET', '/admin/events' + query(filters));
  const byResource = Boolean(filters.resource);
  const rows = data.events.map((e) => h('tr', {},
    h('td', {}, link('/console/events/' + e.id, e.id)), h('td', {}, time(e.received_at)),
    h('td', {}, e.source), h('td', {}, e.event),
    // The badge: the most urgent delivery state once dispatched, else the event's.
    h('td', {}, e.worst_delivery ? state(e.worst_delivery, e.worst_delivery + ' (' + e.status + ')') : state(e.status)),
    h('td', {}, e.resource || '—'),
    byResource ? h('td', {}, (e.deliveries || []).map((d) => h('span', {}, d.destination + ' ', state(d.state), ' '))) : null));
  const headers = ['Id', 'Received', 'Source', 'Event', 'Status', 'Resource'];
  if (byResource) headers.push('Deliveries');
  const more = data.next_after
    ? h('p', {}, link('/console/events' + query({ ...filters, after: data.next_after }), 'Older events'))
    : null;
  page('Events', form, table('Events', headers, rows), more);
}

async function eventPage(id) {
  const e = await api('GET', '/admin/events/' + encodeURIComponent(id));
  let body = e.body;
  let pretty = body;
  if (body !== null && e.body_encoding === 'utf8') {
    try { pretty = JSON.stringify(JSON.parse(body), null, 2); } catch (_) { pretty = body; }
  }
  const replay = async (destinations) => {
    const what = destinations ? destinations.join(', ') : 'every destination it was routed to';
    if (!await confirmed('Replay event ' + e.id + ' to ' + what + '?', 'Replay')) return;
    try {
      const r = await api('POST', '/admin/events/' + e.id + '/replay', destinations ? { destinations } : {});
      const left = (r.filtered || []).map((f) => f.destination + ' (' + f.reason + ')');
      say(r.replayed + ' deliver' + (r.replayed === 1 ? 'y' : 'ies') + ' scheduled again'
        + (left.length ? '; left out by their filter: ' + left.join(', ') : ''));
      render();
    } catch (err) { if (err instanceof SignedOut) signIn(); else say(err.message); }
  };
  const facts = h('dl', { class: 'facts' },
    h('dt', {}, 'Id'), h('dd', {}, e.id),
    h('dt', {}, 'Event'), h('dd', {}, e.event),
    h('dt', {}, 'Source'), h('dd', {}, e.source),
    h('dt', {}, 'Received'), h('dd', {}, time(e.received_at)),
    h('dt', {}, 'Status'), h('dd', {}, state(e.status)),
    h('dt', {}, 'Dedup'), h('dd', {}, e.duplicate_of
      ? ['duplicate of ', link('/console/events/' + e.duplicate_of, 'event ' + e.duplicate_of)]
      : (e.status === 'duplicate' ? 'duplicate' : 'first copy')),
    h('dt', {}, 'Resource'), h('dd', {}, e.resource
      ? link('/console/events' + query({ resource: e.resource }), e.resource) : '—'),
    h('dt', {}, 'Size'), h('dd', {}, e.size + ' bytes', e.content_type ? ' · ' + e.content_type : ''),
    e.reason ? [h('dt', {}, 'Rejected'), h('dd', {}, e.reason)] : null,
    e.flags.length ? [h('dt', {}, 'Flags'), h('dd', {}, e.flags.join(', '))] : null);
  const headerText = Object.entries(e.headers).map(([k, v]) => k + ': ' + v).join('\n');
  const deliveries = e.deliveries.map((d) => h('section', { class: 'card', 'aria-label': 'Delivery to ' + d.destination },
    h('h3', {}, d.destination, ' ', state(d.state)),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Attempts'), h('dd', {}, d.total_attempts),
      h('dt', {}, 'Next attempt'), h('dd', {}, time(d.next_attempt_at)),
      h('dt', {}, 'Delivered'), h('dd', {}, time(d.delivered_at)),
      d.last_error ? [h('dt', {}, 'Last error'), h('dd', { class: 'error' }, d.last_error)] : null,
      d.reason ? [h('dt', {}, 'Why'), h('dd', {}, d.reason)] : null),
    table('Attempts to ' + d.destination, ['When', 'Took', 'Status', 'Error', 'Answer'],
      d.attempts.map((a) => h('tr', {}, h('td', {}, time(a.at)), h('td', {}, a.duration_ms.toFixed(1) + ' ms'),
        h('td', {}, a.status === null ? '—' : a.status), h('td', {}, a.error || ''), h('td', { class: 'answer' }, answer(a.answer))))),
    may('operator') ? h('div', { class: 'actions' }, h('button', { type: 'button', onclick: () => replay([d.destination]) }, 'Replay to ' + d.destination)) : null));
  page('Event ' + e.id,
    facts,
    may('operator') ? h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'primary', onclick: () => replay(null), disabled: !e.destinations || !e.destinations.length },
        session.destinations ? 'Replay to my destinations' : 'Replay to all destinations')) : null,
    h('h2', {}, 'Deliveries'),
    deliveries.length ? h('div', { class: 'cards wide' }, deliveries) : h('p', { class: 'muted' }, 'No deliveries.'),
    ...(e.redacted ? [h('h2', {}, 'Headers and body'),
      h('p', { class: 'muted', id: 'redacted' }, 'Hidden: the headers and the body need the admin role (you are ' + session.role + ').')] : [
    h('h2', {}, 'Headers'), h('div', { class: 'actions' }, copyButton('Headers', headerText)), h('pre', {}, headerText),
    h('h2', {}, 'Body'),
    body === null ? h('p', { class: 'muted' }, e.body_pruned
      ? 'Dropped by retention.delivered_bodies (the record and its attempts stay; it cannot be replayed).'
      : 'Not kept (rejected).') : [
      h('div', { class: 'actions' }, copyButton('Body', body)),
      h('pre', {}, e.body_encoding === 'base64' ? '(base64) ' + body : pretty)]]));
}

async function deadLetters() {
  const params = new URLSearchParams(location.search);
  const filters = {};
  for (const k of ['destination', 'source', 'event', 'since', 'until']) if (params.get(k)) filters[k] = params.get(k);
  const [list, dests] = await Promise.all([
    api('GET', '/admin/dead-letters' + query({ ...filters, limit: '1000' })),
    api('GET', '/admin/destinations')]);
  const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    for (const k of ['since', 'until']) if (data[k]) data[k] = new Date(data[k]).toISOString();
    navigate('/console/dead-letters' + query(data));
  } },
  h('label', {}, 'Destination', h('select', { name: 'destination' },
    h('option', { value: '' }, 'any'),
    dests.destinations.map((d) => h('option', { value: d.name, selected: filters.destination === d.name }, d.name)))),
  h('label', {}, 'Source', h('input', { name: 'source', value: filters.source || '' })),
  h('label', {}, 'Event', h('input', { name: 'event', value: filters.event || '' })),
  h('label', {}, 'Received from', h('input', { type: 'datetime-local', name: 'since', value: localInput(filters.since) })),
  h('label', {}, 'Received before', h('input', { type: 'datetime-local', name: 'until', value: localInput(filters.until) })),
  h('button', { type: 'submit', class: 'primary' }, 'Filter'));
  const boxes = [];
  const rows = list.dead_letters.map((d) => {
    const box = h('input', { type: 'checkbox', 'aria-label': 'Select event ' + d.event + ' to ' + d.destination });
    box.dataset.event = d.event;
    box.dataset.destination = d.destination;
    boxes.push(box);
    return h('tr', {}, h('td', {}, box), h('td', {}, link('/console/events/' + d.event, d.event)),
      h('td', {}, d.destination), h('td', {}, time(d.created_at)), h('td', { class: 'num' }, d.total_attempts),
      h('td', {}, d.last_status === null ? '—' : d.last_status), h('td', {}, d.last_error || ''));
  });
  const selected = () => boxes.filter((b) => b.checked);
  const onSelected = async (action, verb, done) => {
    const chosen = selected();
    if (!chosen.length) return say('Select dead letters first.');
    const n = chosen.length;
    if (!await confirmed(verb + ' ' + n + ' dead letter' + (n === 1 ? '' : 's') + '?', verb)) return;
    try {
      const r = await api('POST', '/admin/dead-letters/selection/' + action, {
        dead_letters: chosen.map((b) => ({ event: b.dataset.event, destination: b.dataset.destination })),
      });
      const count = action === 'replay' ? r.replayed : r.deleted;
      say(count + ' dead letter' + (count === 1 ? '' : 's') + ' ' + done);
    } catch (err) { say(err.message); }
    render();
  };
  const bulk = async (method, path, verb) => {
    const n = list.dead_letters.length;
    const shown = list.next_after ? 'at least ' + n : String(n);
    if (!await confirmed(verb + ' all ' + shown + ' dead letters matching these filters?', verb)) return;
    try {
      const r = await api(method, path + query(filters));
      const count = r.replayed !== undefined ? r.replayed : r.deleted;
      say(count + ' dead letter' + (count === 1 ? '' : 's') + (method === 'POST' ? ' replayed' : ' discarded'));
    } catch (err) { say(err.message); }
    render();
  };
  const selectAll = h('input', { type: 'checkbox', 'aria-label': 'Select all', onchange: (e) => boxes.forEach((b) => { b.checked = e.target.checked; }) });
  page('Dead letters', form,
    may('operator') ? h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'primary', onclick: () => onSelected('replay', 'Replay', 'replayed') }, 'Replay selected'),
      h('button', { type: 'button', class: 'danger', onclick: () => onSelected('discard', 'Discard', 'discarded') }, 'Discard selected'),
      h('button', { type: 'button', onclick: () => bulk('POST', '/admin/dead-letters/replay', 'Replay') }, 'Replay all matching'),
      h('button', { type: 'button', class: 'danger', onclick: () => bulk('DELETE', '/admin/dead-letters', 'Discard') }, 'Discard all matching')) : null,
    h('div', { class: 'table-wrap', role: 'region', tabindex: 0, 'aria-label': 'Dead letters' }, h('table', {},
      h('caption', { class: 'skip' }, 'Dead letters'),
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, selectAll),
        ['Event', 'Destination', 'Created', 'Attempts', 'Last status', 'Last error'].map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No dead letters.'))))));
}

async function destinations() {
  const data = await api('GET', '/admin/destinations');
  const toggle = async (d) => {
    const verb = d.paused ? 'Resume' : 'Pause';
    const what = d.paused ? 'Deliveries to ' + d.name + ' start again.' : 'Deliveries to ' + d.name + ' wait (nothing is dropped).';
    if (!await confirmed(verb + ' ' + d.name + '? ' + what, verb)) return;
    try {
      const r = await api('POST', '/admin/destinations/' + encodeURIComponent(d.name) + '/' + verb.toLowerCase());
      say(r.name + (r.paused ? ' paused' : ' resumed'));
    } catch (err) { say(err.message); }
    render();
  };
  const globs = (list) => (list && list.length ? list.join(', ') : 'all');
  const rows = data.destinations.map((d) => h('tr', {},
    h('th', { scope: 'row' }, d.name), h('td', {}, d.url),
    h('td', {}, d.paused ? state('paused') : state('active')),
    h('td', {}, circuit(d.circuit), d.circuit_since ? h('span', { class: 'muted' }, ' since ', time(d.circuit_since)) : null),
    h('td', {}, 'sources: ' + globs(d.sources), h('br'), 'events: ' + globs(d.events), h('br'), 'order: ' + d.ordering),
    h('td', { class: 'num' }, d.fleet_share + ' of ' + d.max_concurrency),
    h('td', { class: 'num' }, d.in_flight),
    may('operator') ? h('td', {}, h('button', { type: 'button', onclick: () => toggle(d) }, (d.paused ? 'Resume ' : 'Pause ') + d.name)) : null));
  const headers = ['Destination', 'URL', 'State', 'Circuit', 'Route', 'Share', 'In flight'].concat(may('operator') ? ['Action'] : []);
  page('Destinations', table('Destinations', headers, rows));
}

/** The start of an attempt's answer: its first line in the table, all of it on demand. */
function answer(text) {
  if (!text) return '';
  const first = text.split('\n')[0];
  if (first.length <= 60 && first === text) return h('code', {}, text);
  return h('details', {}, h('summary', {}, first.slice(0, 60) + '…'), h('pre', {}, text));
}

async function hooks() {
  const [data, ov] = await Promise.all([api('GET', '/admin/hooks'), api('GET', '/admin/overview')]);
  const bySource = Object.fromEntries(ov.sources.map((x) => [x.source, x]));
  const sync = async () => {
    try {
      const r = await api('POST', '/admin/hooks/sync');
      const errors = r.accounts.flatMap((a) => a.errors);
      const changes = r.accounts.flatMap((a) => a.changes.map((c) => c.action + ' ' + c.event + ' (hook ' + c.hook_id + ')'));
      say(errors.length ? 'Sync: ' + errors.join('; ')
        : 'Sync done: ' + r.accounts.length + ' account(s); ' + (changes.length ? changes.join(', ') : 'nothing to change'));
    } catch (err) { say(err.message); }
    render();
  };
  const sections = data.accounts.map((a) => {
    const counts = bySource[a.source] || { events: {}, missing: {} };
    const gaps = Object.fromEntries((a.last_gaps || []).map((g) => [g.event, g]));
    const gap = (event) => {
      const g = gaps[event];
      if (!g) return 'none';
      return link('/console/events/' + g.hook_gap_event, [time(g.window_start), ' – ', time(g.window_end)]);
    };
    return h('section', { 'aria-label': a.source + ' / ' + a.account },
      h('h2', {}, a.source + ' / ' + a.account, ' ', state(a.ok ? 'ok' : 'failing'), a.stale ? [' ', state('stale')] : null),
      h('p', { class: 'muted' }, 'Last reconcile: ', time(a.last_reconcile), a.errors.length ? ' · ' + a.errors.join('; ') : ''),
      a.changes.length ? h('p', {}, 'Changed by it: ' + a.changes.map((c) => c.action + ' ' + c.event).join(', ')) : null,
      h('p', {}, link('/console/events' + query({ source: a.source, event: 'hookrelay.HookGap' }), 'Gaps reported for ' + a.source + ' (HookGap events)')),
      table('Hooks of ' + a.account, ['Event', 'Hook', 'Status', 'Triggered', 'Stored', 'Missing', 'Last triggered', 'Last gap', 'Target'],
        a.hooks.map((x) => h('tr', {}, h('td', {}, x.event), h('td', {}, x.id), h('td', {}, state(String(x.status).toLowerCase())),
          h('td', { class: 'num' }, x.triggered_count === null || x.triggered_count === undefined ? '—' : x.triggered_count),
          h('td', { class: 'num' }, counts.events[x.event] || 0),
          h('td', { class: 'num' }, counts.missing[x.event] || 0),
          h('td', {}, time(x.last_triggered)), h('td', {}, gap(x.event)), h('td', {}, x.target)))));
  });
  page('Hooks',
    h('p', { class: 'muted' }, 'Triggered: the upstream\'s count on the hook. Stored: callbacks this relay stored for the event since it started. Missing: calls counted upstream that no stored callback answers.'),
    may('operator') ? h('div', { class: 'actions' }, h('button', { type: 'button', class: 'primary', onclick: sync }, 'Sync now')) : null,
    sections.length ? sections : h('p', { class: 'muted' }, 'No upstream accounts configured.'));
}

const ACTIONS = ['', 'replay', 'discard', 'pause', 'resume', 'hook_sync', 'sign_in', 'sign_out', 'sign_in_failed', 'reload', 'backup'];

/** The journal: every change made through the API or this console, newest first. */
async function journal() {
  const params = new URLSearchParams(location.search);
  const form = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    navigate('/console/journal' + query(Object.fromEntries(new FormData(form))));
  } },
  h('label', {}, 'Who', h('input', { name: 'who', value: params.get('who') || '', placeholder: 'a token\'s name', autocomplete: 'off' })),
  h('label', {}, 'Action', h('select', { name: 'action' },
    ACTIONS.map((a) => h('option', { value: a, selected: params.get('action') === a }, a || 'any')))),
  h('button', { type: 'submit', class: 'primary' }, 'Filter'));
  const filters = {};
  for (const k of ['who', 'action', 'before']) if (params.get(k)) filters[k] = params.get(k);
  const data = await api('GET', '/admin/journal' + query(filters));
  const rows = data.entries.map((e) => h('tr', {},
    h('td', {}, time(e.at)), h('td', {}, e.who || '—'), h('td', {}, e.from || '—'),
    h('td', {}, e.action), h('td', {}, h('code', {}, JSON.stringify(e.target))),
    h('td', { class: 'num' }, e.count), h('td', { class: e.result === 'ok' ? '' : 'error' }, e.result)));
  page('Journal', form,
    table('Journal', ['When', 'Who', 'From', 'Action', 'On', 'Count', 'Result'], rows),
    data.next_before ? h('p', {}, link('/console/journal' + query({ ...filters, before: data.next_before }), 'Older')) : null);
}

// ---- sign-in and routing -----------------------------------------------------------

function signIn(message) {
  document.getElementById('nav').hidden = true;
  const input = h('input', { type: 'password', name: 'token', id: 'token', required: true, autocomplete: 'current-password' });
  const error = h('p', { class: 'error', role: 'alert', id: 'sign-in-error' }, message || '');
  const form = h('form', { class: 'signin', method: 'post', action: '/console/session', onsubmit: async (e) => {
    e.preventDefault();
    error.textContent = '';
    try {
      const resp = await fetch('/console/session', {
        method: 'POST', credentials: 'same-origin', cache: 'no-store',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify({ token: input.value }),
      });
      const data = await resp.json().catch(() => ({}));
      if (!resp.ok) { error.textContent = data.error || ('HTTP ' + resp.status); input.select(); return; }
      remember(data);
      input.value = '';
      render();
    } catch (err) { error.textContent = err.message; }
  } },
  h('label', { for: 'token' }, 'Token', input),
  h('button', { type: 'submit', class: 'primary' }, 'Sign in'),
  error);
  page('Sign in', h('p', { class: 'muted' }, 'The relay\'s admin token (admin.token), or your own of admin.tokens: what you see and may do follows its role. The session ends with the browser.'), form);
  input.focus();
}

const ROUTES = [
  [/^\/console\/?$/, overview],
  [/^\/console\/events\/?$/, events],
  [/^\/console\/events\/([0-9A-Za-z]+)\/?$/, eventPage],
  [/^\/console\/dead-letters\/?$/, deadLetters],
  [/^\/console\/destinations\/?$/, destinations],
  [/^\/console\/hooks\/?$/, hooks],
  [/^\/console\/journal\/?$/, journal],
];

async function render(quiet) {
  clearTimeout(refresh);
  if (!session.csrf) {
    try {
      const resp = await fetch('/console/session', { credentials: 'same-origin', cache: 'no-store' });
      const data = await resp.json().catch(() => ({}));
      if (!resp.ok) return page('Console unavailable', h('p', { class: 'error', role: 'alert' }, data.error || ('HTTP ' + resp.status)));
      remember(data);
    } catch (_) { /* shown as signed out */ }
    if (!session.csrf) return signIn();
  }
  document.getElementById('nav').hidden = false;
  for (const a of document.querySelectorAll('nav a')) {
    const here = a.getAttribute('href') === location.pathname.replace(/\/$/, '') || (a.getAttribute('href') === '/console/' && /^\/console\/?$/.test(location.pathname));
    if (here) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const route = ROUTES.find(([re]) => re.test(location.pathname));
  if (!route) return page('Not found', h('p', {}, 'No such console page. ', link('/console/', 'Overview')));
  try {
    await route[1](...location.pathname.match(route[0]).slice(1));
    if (!quiet) document.getElementById('main').focus({ preventScroll: true });
  } catch (e) { failed(e); }
}

function navigate(url) {
  history.pushState(null, '', url);
  render();
}

document.addEventListener('click', (e) => {
  const a = e.target.closest && e.target.closest('a[data-nav]');
  if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  e.preventDefault();
  navigate(a.getAttribute('href'));
});
window.addEventListener('popstate', () => render());
document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('sign-out').addEventListener('click', async () => {
    await fetch('/console/session', { method: 'DELETE', credentials: 'same-origin', headers: { 'X-CSRF-Token': session.csrf || '' } });
    remember({});
    signIn('Signed out.');
  });
  render();
});
