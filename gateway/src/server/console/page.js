'use strict';
// Draws GET /cluster and asks again every EVERY_MS while the tab is visible. Everything
// from the server is written as text (textContent), never as markup.
(function () {
  const EVERY_MS = 2000;
  const KEY = 'moongate.adminKey';
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let busy = false;
  let firstRenderMs = null;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function bytes(n) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 2 : 1)) + ' ' + units[i];
  }

  function count(n) {
    if (n < 1e4) return String(n);
    if (n < 1e6) return (n / 1e3).toFixed(1) + 'k';
    if (n < 1e9) return (n / 1e6).toFixed(2) + 'M';
    return (n / 1e9).toFixed(2) + 'G';
  }

  function pct(x) { return x === null || x === undefined ? '–' : (x * 100).toFixed(1) + '%'; }

  function since(secs) {
    const d = Math.floor(secs / 86400), h = Math.floor(secs / 3600) % 24;
    const m = Math.floor(secs / 60) % 60, s = secs % 60;
    if (d > 0) return d + 'd ' + h + 'h';
    if (h > 0) return h + 'h ' + m + 'm';
    if (m > 0) return m + 'm ' + s + 's';
    return s + 's';
  }

  // A usage bar (fraction 0..1) followed by its text.
  function bar(frac, text) {
    const span = el('span');
    const b = el('span', null, 'bar');
    const fill = el('i');
    fill.style.width = (Math.max(0, Math.min(1, frac || 0)) * 100).toFixed(1) + '%';
    b.appendChild(fill);
    span.append(b, text);
    return span;
  }

  // Fills table `t`: `head` is a list of [label, numeric?], `rows` lists of cells (text
  // or a Node).
  function fill(t, head, rows, empty) {
    const thead = el('thead');
    const hr = el('tr');
    head.forEach(([label, num]) => hr.appendChild(el('th', label, num ? 'num' : '')));
    thead.appendChild(hr);
    const tbody = el('tbody');
    if (rows.length === 0) {
      const tr = el('tr');
      const td = el('td', empty, 'muted');
      td.colSpan = head.length;
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    rows.forEach((cells) => {
      const tr = el('tr');
      cells.forEach((c, i) => {
        const td = el('td', null, head[i][1] ? 'num' : '');
        if (c instanceof Node) td.appendChild(c); else td.textContent = String(c);
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
    });
    t.replaceChildren(thead, tbody);
  }

  function cards(parent, items) {
    parent.replaceChildren(...items.map(([label, value, sub]) => {
      const c = el('div', null, 'card');
      c.append(el('span', label, 'muted'), el('b', value));
      if (sub) c.appendChild(el('span', sub, 'muted'));
      return c;
    }));
  }

  function state(w) {
    const i = w.info;
    if (i.draining) return ['draining', 'warn'];
    if (i.circuit.state === 'open') return ['breaker open', 'bad'];
    if (i.circuit.state === 'half_open') return ['breaker half-open', 'warn'];
    if (i.status === 'ready') return ['ready', 'ok'];
    if (i.status === 'pending') return ['pending', 'warn'];
    return ['not ready', 'bad'];
  }

  function drawWorkers(ws) {
    const rows = ws.map((w) => {
      const i = w.info;
      const [text, cls] = state(w);
      const r = w.reported_load;
      const name = i.dp_rank === undefined ? i.url : i.url + ' #' + i.dp_rank;
      return [
        name, i.worker_type, el('span', text, 'pill ' + cls), i.load,
        count(w.prefill_backlog_tokens),
        r ? bar(r.token_usage, pct(r.token_usage)) : '–',
        r ? r.waiting_reqs : '–',
        i.model_id || '–',
        i.health.last_error || '',
      ];
    });
    fill($('workers'), [['worker'], ['role'], ['state'], ['in flight', 1], ['prefill backlog', 1],
      ['KV usage'], ['waiting', 1], ['model'], ['last error']], rows, 'no workers registered');
  }

  function drawRouting(routing) {
    const rows = routing.map((t) => {
      const total = Object.values(t.decisions).reduce((a, b) => a + b, 0);
      const parts = Object.entries(t.decisions).filter(([, n]) => n > 0)
        .map(([k, n]) => k + ' ' + count(n)).join(' · ');
      const hit = t.hit_rate === undefined ? '–' : bar(t.hit_rate, pct(t.hit_rate));
      // kv_aware: each tier's share of the prompt tokens routed.
      const tiers = Object.entries(t.cached_tokens || {});
      const cached = tiers.reduce((a, [, n]) => a + n, 0);
      const byTier = tiers.filter(([, n]) => n > 0)
        .map(([k, n]) => k + ' ' + pct(t.hit_rate * n / cached)).join(' · ');
      return [t.policy, t.in_use ? 'yes' : '', count(total), hit, byTier || '–', parts || '–'];
    });
    fill($('routing'), [['policy'], ['in use'], ['decisions', 1], ['hit rate'], ['hits by tier'],
      ['by decision']], rows, '');
  }

  function drawMaster(m) {
    const section = $('master-section');
    section.hidden = !m;
    if (!m) return;
    const role = $('master-role');
    role.textContent = m.role + (m.leader_url && m.role !== 'leader' ? ' → ' + m.leader_url : '');
    role.className = 'pill ' + (m.role === 'candidate' ? 'warn' : 'ok');
    const s = m.stats;
    const v = m.view;
    if (!s) {
      const here = [['answers', m.role === 'follows' ? 'elsewhere' : 'on the leader',
        m.leader_url || 'no leader known']];
      if (v) here.push(['store view', count(v.pages) + ' pages',
        count(v.events) + ' events, ' + count(v.snapshots) + ' snapshots']);
      cards($('master-cards'), here);
    } else {
      const reads = s.reads_from_memory + s.reads_from_disk + s.read_misses;
      const hits = reads ? (s.reads_from_memory + s.reads_from_disk) / reads : null;
      cards($('master-cards'), [
        ['memory used', bytes(s.allocated_bytes), 'of ' + bytes(s.capacity_bytes)],
        ['objects', count(s.keys), s.segments + ' segments'],
        ['clients', s.clients_ok + ' / ' + s.clients, 'alive / known'],
        ['read hit rate', pct(hits), count(reads) + ' reads'],
        ['from memory', count(s.reads_from_memory), 'from disk ' + count(s.reads_from_disk)],
        ['disk tier', count(s.disk_offloads) + ' out', count(s.disk_loads) + ' back in'],
        ['evicted', count(s.evicted_objects), bytes(s.evicted_bytes)],
      ]);
    }
    const rows = m.segments.map((g) => [
      g.name, g.endpoint,
      bar(g.capacity_bytes ? g.allocated_bytes / g.capacity_bytes : 0,
        bytes(g.allocated_bytes) + ' / ' + bytes(g.capacity_bytes)),
      count(g.allocations),
      g.disk_bytes ? bytes(g.disk_bytes) + (g.disk_write_through ? ', write-through' : ', on eviction') : 'none',
    ]);
    fill($('segments'), [['segment'], ['endpoint'], ['memory'], ['allocations', 1], ['disk tier']],
      rows, s ? 'no segments mounted' : 'segments are listed where the master answers');
  }

  function draw(v) {
    const g = v.gateway;
    const ready = v.workers.filter((w) => state(w)[0] === 'ready').length;
    $('summary').textContent = 'v' + g.version + ' · ' + g.mode + ' · ' + g.policies.join(' / ') +
      ' · up ' + since(g.uptime_secs);
    cards($('cards'), [
      ['workers ready', ready + ' / ' + v.workers.length],
      ['in flight', count(g.in_flight)],
      ['waiting for admission', count(g.admission_waiting)],
    ]);
    drawWorkers(v.workers);
    drawRouting(v.routing);
    drawMaster(v.master);
  }

  function problem(text) {
    const p = $('problem');
    p.hidden = !text;
    p.textContent = text || '';
  }

  function live(text, cls) {
    const l = $('live');
    l.textContent = text;
    l.className = 'pill ' + cls;
  }

  // What the page has fetched (Resource Timing), for whoever checks it.
  function account(ms, size) {
    const f = $('footer');
    const requests = performance.getEntriesByType('resource').map((e) => new URL(e.name).pathname);
    const nav = performance.getEntriesByType('navigation')[0];
    const transferred = performance.getEntriesByType('resource')
      .reduce((a, e) => a + (e.transferSize || 0), nav ? nav.transferSize || 0 : 0);
    f.dataset.requests = Array.from(new Set(requests)).join(' ');
    f.dataset.transferred = String(transferred);
    if (firstRenderMs === null) {
      firstRenderMs = Math.round(performance.now());
      f.dataset.firstRenderMs = String(firstRenderMs);
    }
    f.textContent = 'refreshed ' + new Date().toLocaleTimeString() + ' · ' + bytes(size) +
      ' in ' + Math.round(ms) + ' ms · every ' + EVERY_MS / 1000 + ' s while visible';
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try { await ask(); } finally { busy = false; }
  }

  async function ask() {
    timer = null;
    const key = sessionStorage.getItem(KEY);
    const headers = key ? { Authorization: 'Bearer ' + key } : {};
    const t0 = performance.now();
    try {
      const r = await fetch('/cluster', { headers, cache: 'no-store', credentials: 'omit' });
      const body = await r.text();
      if (r.status === 401 || r.status === 403) {
        let why = 'status ' + r.status;
        try { why = JSON.parse(body).error.message; } catch (e) { /* not the envelope */ }
        if (key) sessionStorage.removeItem(KEY);
        $('signin').hidden = false;
        $('signin-why').textContent = why;
        live('signed out', 'warn');
        return;
      }
      if (!r.ok) throw new Error('/cluster answered ' + r.status);
      $('signin').hidden = true;
      draw(JSON.parse(body));
      problem(null);
      live('live', 'ok');
      account(performance.now() - t0, body.length);
    } catch (e) {
      problem('cannot read /cluster: ' + e.message + ' (showing the last answer)');
      live('stale', 'bad');
    }
    timer = null;
    schedule();
  }

  // The next turn (none while the tab is hidden: showing it again asks at once).
  function schedule() {
    if (timer === null && !document.hidden) timer = setTimeout(refresh, EVERY_MS);
  }

  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && timer === null) refresh();
  });
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const k = $('key').value.trim();
    $('key').value = '';
    if (k) sessionStorage.setItem(KEY, k);
    refresh();
  });
  refresh();
})();
