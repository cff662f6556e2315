// MiniDesk: five small apps (mail, files, sheet, settings, calendar) sharing one state object.
// The GUI mutates the state through DOM events; the tool API (DESK.callTool) mutates the same
// state directly. Tasks (tasks.js) generate the initial state from a seed and verify it in-page.
'use strict';

var DESK = (function () {
  var S = null;          // shared state of every app (see blankState)
  var fsVersion = 0;     // bumped on every file-system change, so Python mirrors only when needed
  var APPS = ['mail', 'files', 'sheet', 'settings', 'calendar'];
  var COLS = ['A', 'B', 'C', 'D'];
  var FOLDERS_MAIL = ['inbox', 'archive', 'sent', 'trash'];
  var OPTIONS = {
    theme: ['light', 'dark'],
    language: ['English', 'German', 'French', 'Spanish', 'Japanese'],
    timezone: ['UTC', 'Europe/Berlin', 'America/New_York', 'Asia/Tokyo', 'Australia/Sydney'],
    font_size: ['12', '14', '16', '18', '20']
  };
  var TOGGLES = ['notifications', 'autosave'];

  function blankState() {
    return {
      app: 'home', answer: null, done: false,
      mail: {messages: [], folder: 'inbox', open: null, compose: null, nextId: 1},
      files: {folders: [], files: [], cwd: '', open: null, renaming: null, newFile: null, newFolder: ''},
      sheet: {rows: 1, cells: {}, sortCol: 'A', sortOrder: 'asc'},
      settings: {theme: 'light', language: 'English', timezone: 'UTC', font_size: '14', notifications: true, autosave: false},
      calendar: {events: [], editing: null, editDate: '', draft: {title: '', date: '', time: ''}, nextId: 1}
    };
  }

  // --- small helpers -------------------------------------------------------------------------
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function k(key) { return ' data-k="' + esc(key) + '"'; }
  function act(name, arg) { return ' data-act="' + name + '"' + (arg === undefined ? '' : ' data-arg="' + esc(arg) + '"'); }
  function btn(label, name, arg, key, extra) {
    return '<button' + act(name, arg) + k(key) + (extra || '') + '>' + esc(label) + '</button>';
  }
  function input(key, bind, value, label, tag) {
    if (tag === 'textarea') return '<textarea' + k(key) + ' data-bind="' + bind + '" aria-label="' + esc(label) + '">' + esc(value) + '</textarea>';
    return '<input' + k(key) + ' data-bind="' + bind + '" aria-label="' + esc(label) + '" value="' + esc(value) + '">';
  }
  function select(key, bind, options, value, label) {
    var html = '<select' + k(key) + ' data-bind="' + bind + '" aria-label="' + esc(label) + '">';
    options.forEach(function (o) {
      html += '<option value="' + esc(o) + '"' + (String(o) === String(value) ? ' selected' : '') + '>' + esc(cap(o)) + '</option>';
    });
    return html + '</select>';
  }
  function cap(s) { s = String(s); return s.charAt(0).toUpperCase() + s.slice(1); }
  function fail(msg) { throw new Error(msg); }
  function norm(s) { return String(s === null || s === undefined ? '' : s).trim().toLowerCase(); }
  function byId(list, id) { return list.filter(function (x) { return String(x.id) === String(id); })[0]; }
  function cellRef(ref) {
    var m = /^([A-Da-d])([0-9]+)$/.exec(String(ref).trim());
    if (!m) fail('bad cell reference ' + JSON.stringify(ref) + ' (use e.g. B3; columns A-D)');
    return {col: m[1].toUpperCase(), row: +m[2]};
  }
  function rangeRefs(range) {
    var parts = String(range).split(':');
    var a = cellRef(parts[0]), b = cellRef(parts[1] || parts[0]);
    if (b.row > S.sheet.rows || a.row < 1) fail('range ' + range + ' is outside rows 1-' + S.sheet.rows);
    var out = [];
    for (var r = Math.min(a.row, b.row); r <= Math.max(a.row, b.row); r++) {
      var line = [];
      for (var c = Math.min(COLS.indexOf(a.col), COLS.indexOf(b.col)); c <= Math.max(COLS.indexOf(a.col), COLS.indexOf(b.col)); c++) line.push(COLS[c] + r);
      out.push(line);
    }
    return out;
  }
  function cell(ref) { return S.sheet.cells[ref] === undefined ? '' : S.sheet.cells[ref]; }
  function fileOf(path) { return S.files.files.filter(function (f) { return f.path === path; })[0]; }
  function folderOf(path) { return path.indexOf('/') < 0 ? '' : path.slice(0, path.lastIndexOf('/')); }
  function baseName(path) { return path.slice(path.lastIndexOf('/') + 1); }
  function touchFs() { fsVersion++; }

  // --- rendering ------------------------------------------------------------------------------
  function render() {
    var bar = '';
    APPS.forEach(function (a) {
      bar += btn(cap(a), 'app', a, 'app-' + a, S.app === a ? ' aria-current="page"' : '');
    });
    document.getElementById('taskbar').innerHTML = bar;
    var view = {home: renderHome, mail: renderMail, files: renderFiles, sheet: renderSheet,
                settings: renderSettings, calendar: renderCalendar}[S.app]();
    if (S.lastError) { view = '<p role="alert">Error: ' + esc(S.lastError) + '</p>' + view; S.lastError = null; }
    document.getElementById('app').innerHTML = view;
    document.body.className = S.settings.theme === 'dark' ? 'dark' : '';
    document.title = 'MiniDesk - ' + cap(S.app);
  }
  function renderHome() { return '<h1>MiniDesk</h1><p>Open an app from the taskbar.</p>'; }

  function renderMail() {
    var m = S.mail, h = '<h2>Mail</h2>';
    if (m.compose) {
      return h + '<h3>New message</h3>' + input('compose-to', 'compose.to', m.compose.to, 'To') +
        input('compose-subject', 'compose.subject', m.compose.subject, 'Subject') +
        input('compose-body', 'compose.body', m.compose.body, 'Body', 'textarea') +
        btn('Send', 'mail-send', undefined, 'compose-send') + btn('Cancel', 'mail-cancel', undefined, 'compose-cancel');
    }
    if (m.open !== null) {
      var msg = byId(m.messages, m.open);
      return h + '<h3>' + esc(msg.subject) + '</h3><p>From: ' + esc(msg.from) + '</p><p>To: ' + esc(msg.to) +
        '</p><p>' + esc(msg.body) + '</p>' + btn('Reply', 'mail-reply', undefined, 'mail-reply') +
        btn('Forward', 'mail-forward', undefined, 'mail-forward') + btn('Archive', 'mail-archive', undefined, 'mail-archive') +
        btn('Delete', 'mail-delete', undefined, 'mail-delete') + btn('Back', 'mail-back', undefined, 'mail-back');
    }
    FOLDERS_MAIL.forEach(function (f) { h += btn(cap(f), 'mail-folder', f, 'mail-folder-' + f, m.folder === f ? ' aria-current="page"' : ''); });
    h += btn('Compose', 'mail-compose', undefined, 'mail-compose') + btn('Mark all read', 'mail-markall', undefined, 'mail-markall');
    m.messages.filter(function (x) { return x.folder === m.folder; }).forEach(function (x) {
      h += '<div class="row' + (x.read ? '' : ' unread') + '"' + act('mail-open', x.id) + k('mail-row-' + x.id) + '>' +
        btn(x.starred ? 'Starred' : 'Star', 'mail-star', x.id, 'mail-star-' + x.id, x.starred ? ' aria-pressed="true"' : '') +
        '<span>' + esc(x.from) + '</span><span>' + esc(x.subject) + '</span>' + (x.read ? '' : '<span>(unread)</span>') + '</div>';
    });
    return h;
  }

  function renderFiles() {
    var f = S.files, h = '<h2>Files</h2>';
    if (f.cwd === '') {
      f.folders.forEach(function (d) { h += '<div class="row"' + act('files-cd', d) + k('files-folder-' + d) + '>[folder] ' + esc(d) + '</div>'; });
      return h + input('files-newfolder-name', 'files.newFolder', f.newFolder, 'New folder name') +
        btn('Create folder', 'files-mkdir', undefined, 'files-mkdir');
    }
    h += btn('Up', 'files-up', undefined, 'files-up') + '<h3>Folder: ' + esc(f.cwd) + '</h3>';
    f.files.filter(function (x) { return folderOf(x.path) === f.cwd; }).forEach(function (x) {
      var p = x.path, others = f.folders.filter(function (d) { return d !== f.cwd; });
      h += '<div class="row"' + k('files-row-' + p) + '><span>' + esc(baseName(p)) + '</span>' +
        btn('Open', 'files-open', p, 'files-open-' + p) + btn('Rename', 'files-rename', p, 'files-rename-' + p) +
        select('files-move-select-' + p, 'move:' + p, others, x.moveTo || others[0], 'Move to') +
        btn('Move', 'files-move', p, 'files-move-' + p) + btn('Delete', 'files-delete', p, 'files-delete-' + p) + '</div>';
      if (f.renaming === p) {
        h += input('files-rename-input', 'files.renameTo', f.renameTo, 'New name') + btn('OK', 'files-rename-ok', p, 'files-rename-ok');
      }
      if (f.open === p) h += '<pre>' + esc(x.content) + '</pre>';
    });
    if (f.newFile) {
      h += input('newfile-name', 'newfile.name', f.newFile.name, 'File name') +
        input('newfile-content', 'newfile.content', f.newFile.content, 'Content', 'textarea') +
        btn('Create', 'files-create', undefined, 'newfile-create');
    } else {
      h += btn('New file', 'files-newfile', undefined, 'files-newfile');
    }
    return h;
  }

  function renderSheet() {
    var s = S.sheet, h = '<h2>Sheet</h2>';
    h += select('sheet-sort-col', 'sheet.sortCol', COLS, s.sortCol, 'Sort column') +
      select('sheet-sort-order', 'sheet.sortOrder', ['asc', 'desc'], s.sortOrder, 'Sort order') +
      btn('Sort', 'sheet-sort', undefined, 'sheet-sort') + btn('Add row', 'sheet-addrow', undefined, 'sheet-addrow');
    h += '<table class="sheet"><tr><th></th>' + COLS.map(function (c) { return '<th>' + c + '</th>'; }).join('') + '</tr>';
    for (var r = 1; r <= s.rows; r++) {
      h += '<tr><th>' + r + '</th>';
      COLS.forEach(function (c) { h += '<td>' + input('cell-' + c + r, 'cell:' + c + r, cell(c + r), c + r) + '</td>'; });
      h += '</tr>';
    }
    return h + '</table>';
  }

  function renderSettings() {
    var s = S.settings, h = '<h2>Settings</h2>';
    Object.keys(OPTIONS).forEach(function (key) {
      h += '<p><label>' + cap(key.replace('_', ' ')) + '</label>' + select('set-' + key, 'settings.' + key, OPTIONS[key], s[key], key) + '</p>';
    });
    TOGGLES.forEach(function (key) {
      h += '<p><label><input type="checkbox"' + k('set-' + key) + ' data-bind="settings.' + key + '" aria-label="' + key + '"' +
        (s[key] ? ' checked' : '') + '> ' + cap(key) + '</label></p>';
    });
    return h;
  }

  function renderCalendar() {
    var c = S.calendar, h = '<h2>Calendar</h2>';
    sortedEvents().forEach(function (e) {
      h += '<div class="row"' + k('cal-row-' + e.id) + '><span>' + esc(e.date + ' ' + e.time + ' ' + e.title) + '</span>' +
        btn('Edit', 'cal-edit', e.id, 'cal-edit-' + e.id) + btn('Delete', 'cal-delete', e.id, 'cal-delete-' + e.id) + '</div>';
      if (c.editing === e.id) h += input('cal-edit-date', 'calendar.editDate', c.editDate, 'New date') + btn('Save', 'cal-save', e.id, 'cal-edit-save');
    });
    return h + '<h3>New event</h3>' + input('cal-new-title', 'draft.title', c.draft.title, 'Title') +
      input('cal-new-date', 'draft.date', c.draft.date, 'Date (YYYY-MM-DD)') + input('cal-new-time', 'draft.time', c.draft.time, 'Time (HH:MM)') +
      btn('Add event', 'cal-add', undefined, 'cal-add');
  }
  function sortedEvents() {
    return S.calendar.events.slice().sort(function (a, b) { return (a.date + a.time).localeCompare(b.date + b.time); });
  }

  // --- GUI event handlers (only these and the tool API mutate S) -------------------------------
  var HANDLERS = {
    'app': function (a) { S.app = a; },
    'mail-folder': function (f) { S.mail.folder = f; },
    'mail-open': function (id) { var m = byId(S.mail.messages, id); m.read = true; S.mail.open = m.id; },
    'mail-star': function (id) { var m = byId(S.mail.messages, id); m.starred = !m.starred; },
    'mail-back': function () { S.mail.open = null; },
    'mail-archive': function () { byId(S.mail.messages, S.mail.open).folder = 'archive'; S.mail.open = null; },
    'mail-delete': function () { byId(S.mail.messages, S.mail.open).folder = 'trash'; S.mail.open = null; },
    'mail-compose': function () { S.mail.compose = {to: '', subject: '', body: ''}; },
    'mail-reply': function () {
      var m = byId(S.mail.messages, S.mail.open);
      S.mail.compose = {to: m.from, subject: 'Re: ' + m.subject, body: ''}; S.mail.open = null;
    },
    'mail-forward': function () {
      var m = byId(S.mail.messages, S.mail.open);
      S.mail.compose = {to: '', subject: 'Fwd: ' + m.subject, body: m.body}; S.mail.open = null;
    },
    'mail-cancel': function () { S.mail.compose = null; },
    'mail-send': function () { var c = S.mail.compose; sendMail(c.to, c.subject, c.body); S.mail.compose = null; S.mail.folder = 'sent'; },
    'mail-markall': function () { S.mail.messages.forEach(function (m) { if (m.folder === S.mail.folder) m.read = true; }); },
    'files-cd': function (d) { S.files.cwd = d; S.files.open = S.files.renaming = null; },
    'files-up': function () { S.files.cwd = ''; S.files.open = S.files.renaming = S.files.newFile = null; },
    'files-open': function (p) { S.files.open = S.files.open === p ? null : p; },
    'files-rename': function (p) { S.files.renaming = p; S.files.renameTo = baseName(p); },
    'files-rename-ok': function (p) { API.files_rename({path: p, new_name: S.files.renameTo}); S.files.renaming = null; },
    'files-move': function (p) {
      var f = fileOf(p), others = S.files.folders.filter(function (d) { return d !== S.files.cwd; });
      API.files_move({path: p, folder: f.moveTo || others[0]});
    },
    'files-delete': function (p) { API.files_delete({path: p}); },
    'files-newfile': function () { S.files.newFile = {name: '', content: ''}; },
    'files-create': function () {
      API.files_write({path: S.files.cwd + '/' + S.files.newFile.name.trim(), content: S.files.newFile.content});
      S.files.newFile = null;
    },
    'files-mkdir': function () { API.files_mkdir({name: S.files.newFolder}); S.files.newFolder = ''; },
    'sheet-sort': function () { API.sheet_sort({column: S.sheet.sortCol, descending: S.sheet.sortOrder === 'desc'}); },
    'sheet-addrow': function () { S.sheet.rows += 1; },
    'cal-edit': function (id) { S.calendar.editing = +id; S.calendar.editDate = byId(S.calendar.events, id).date; },
    'cal-save': function (id) { setEventDate(byId(S.calendar.events, id), S.calendar.editDate); S.calendar.editing = null; },
    'cal-delete': function (id) { S.calendar.events = S.calendar.events.filter(function (e) { return String(e.id) !== String(id); }); },
    'cal-add': function () { var d = S.calendar.draft; addEvent(d.title, d.date, d.time); S.calendar.draft = {title: '', date: '', time: ''}; }
  };

  // data-bind="<target>": where an input's value goes. Inputs update state without a re-render so
  // typing keeps focus; clicks and selects re-render.
  function bindValue(bind, el) {
    var value = el.type === 'checkbox' ? el.checked : el.value;
    var m;
    if ((m = /^cell:([A-D][0-9]+)$/.exec(bind))) S.sheet.cells[m[1]] = value;
    else if ((m = /^move:(.*)$/.exec(bind))) fileOf(m[1]).moveTo = value;
    else if ((m = /^compose\.(\w+)$/.exec(bind))) S.mail.compose[m[1]] = value;
    else if ((m = /^newfile\.(\w+)$/.exec(bind))) S.files.newFile[m[1]] = value;
    else if ((m = /^draft\.(\w+)$/.exec(bind))) S.calendar.draft[m[1]] = value;
    else if ((m = /^(files|sheet|settings|calendar)\.(\w+)$/.exec(bind))) S[m[1]][m[2]] = value;
  }
  function onEvent(e) {
    var el = e.target;
    if (!S || !el.dataset) return;
    if (e.type === 'click') {
      var target = el.closest('[data-act]');
      if (!target || el.tagName === 'SELECT' || el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') return;
      try { HANDLERS[target.dataset.act](target.dataset.arg); } catch (err) { S.lastError = String(err.message || err); }
      render();
    } else if (el.dataset.bind) {
      bindValue(el.dataset.bind, el);
      if (e.type === 'change' && (el.tagName === 'SELECT' || el.type === 'checkbox')) render();
    }
  }
  document.addEventListener('click', onEvent);
  document.addEventListener('input', onEvent);
  document.addEventListener('change', onEvent);

  // --- domain operations shared by GUI handlers and tools -------------------------------------
  function sendMail(to, subject, body) {
    if (!String(to).trim()) fail('recipient (to) is empty');
    S.mail.messages.push({id: S.mail.nextId++, from: 'me@minidesk.local', to: String(to).trim(), subject: String(subject),
                          body: String(body), folder: 'sent', read: true, starred: false});
  }
  function addEvent(title, date, time) {
    if (!String(title).trim()) fail('title is empty');
    if (!/^\d{4}-\d{2}-\d{2}$/.test(String(date).trim())) fail('date must be YYYY-MM-DD, got ' + JSON.stringify(date));
    if (!/^\d{2}:\d{2}$/.test(String(time).trim())) fail('time must be HH:MM, got ' + JSON.stringify(time));
    var e = {id: S.calendar.nextId++, title: String(title).trim(), date: String(date).trim(), time: String(time).trim()};
    S.calendar.events.push(e);
    return e;
  }
  function setEventDate(e, date) {
    if (!/^\d{4}-\d{2}-\d{2}$/.test(String(date).trim())) fail('date must be YYYY-MM-DD, got ' + JSON.stringify(date));
    e.date = String(date).trim();
  }
  function eventsTitled(title) {
    var hits = S.calendar.events.filter(function (e) { return norm(e.title) === norm(title); });
    if (!hits.length) fail('no event titled ' + JSON.stringify(title));
    return hits;
  }
  function matchMail(args) {
    if (!args.sender && !args.subject) fail('give sender or subject');
    return S.mail.messages.filter(function (m) {
      return (!args.sender || norm(m.from).indexOf(norm(args.sender)) >= 0) &&
             (!args.subject || norm(m.subject) === norm(args.subject));
    });
  }
  function checkSetting(key, value) {
    if (TOGGLES.indexOf(key) >= 0) {
      var v = norm(value);
      if (['true', 'on', '1', 'yes'].indexOf(v) >= 0) return true;
      if (['false', 'off', '0', 'no'].indexOf(v) >= 0) return false;
      fail(key + ' takes true/false, got ' + JSON.stringify(value));
    }
    if (!OPTIONS[key]) fail('unknown setting ' + JSON.stringify(key) + '; known: ' + Object.keys(OPTIONS).concat(TOGGLES).join(', '));
    var hit = OPTIONS[key].filter(function (o) { return norm(o) === norm(value); })[0];
    if (hit === undefined) fail(key + ' must be one of ' + OPTIONS[key].join(', ') + '; got ' + JSON.stringify(value));
    return hit;
  }

  // --- the tool API (names match the Python tool definitions) ---------------------------------
  var API = {
    mail_search: function (a) {
      var q = norm(a.query);
      return S.mail.messages.filter(function (m) {
        return (!a.folder || m.folder === norm(a.folder)) &&
          (norm(m.from) + ' ' + norm(m.subject) + ' ' + norm(m.body)).indexOf(q) >= 0;
      }).slice(0, 10).map(function (m) {
        return {id: m.id, from: m.from, subject: m.subject, body: m.body, folder: m.folder, read: m.read, starred: m.starred};
      });
    },
    mail_star: function (a) {
      var hits = S.mail.messages.filter(function (m) { return norm(m.from).indexOf(norm(a.sender)) >= 0 && m.folder !== 'sent'; });
      if (!a.sender || !hits.length) fail('no email from ' + JSON.stringify(a.sender));
      hits.forEach(function (m) { m.starred = true; });
      return {starred: hits.length};
    },
    mail_move: function (a) {
      if (FOLDERS_MAIL.indexOf(norm(a.folder)) < 0) fail('folder must be one of ' + FOLDERS_MAIL.join(', '));
      var hits = matchMail(a).filter(function (m) { return m.folder !== 'sent'; });
      if (!hits.length) fail('no matching email');
      hits.forEach(function (m) { m.folder = norm(a.folder); });
      return {moved: hits.length};
    },
    mail_send: function (a) { sendMail(a.to, a.subject, a.body); return {sent: true}; },
    files_list: function (a) {
      if (S.files.folders.indexOf(a.folder) < 0) fail('no folder ' + JSON.stringify(a.folder));
      return S.files.files.filter(function (f) { return folderOf(f.path) === a.folder; }).map(function (f) { return baseName(f.path); });
    },
    files_write: function (a) {
      var dir = folderOf(a.path), name = baseName(a.path);
      if (!dir || S.files.folders.indexOf(dir) < 0) fail('folder ' + JSON.stringify(dir) + ' does not exist');
      if (!name) fail('file name is empty');
      var f = fileOf(a.path);
      if (f) f.content = String(a.content); else S.files.files.push({path: a.path, content: String(a.content)});
      touchFs();
      return {written: a.path};
    },
    files_move: function (a) {
      var f = fileOf(a.path);
      if (!f) fail('no file ' + JSON.stringify(a.path));
      if (S.files.folders.indexOf(a.folder) < 0) fail('no folder ' + JSON.stringify(a.folder));
      var dest = a.folder + '/' + baseName(a.path);
      if (fileOf(dest)) fail(dest + ' already exists');
      f.path = dest; f.moveTo = undefined; touchFs();
      return {moved_to: dest};
    },
    files_rename: function (a) {
      var f = fileOf(a.path), name = String(a.new_name || '').trim();
      if (!f) fail('no file ' + JSON.stringify(a.path));
      if (!name || name.indexOf('/') >= 0) fail('new_name must be a plain file name');
      var dest = folderOf(a.path) + '/' + name;
      if (fileOf(dest)) fail(dest + ' already exists');
      f.path = dest; touchFs();
      return {renamed_to: dest};
    },
    files_delete: function (a) {
      if (!fileOf(a.path)) fail('no file ' + JSON.stringify(a.path));
      S.files.files = S.files.files.filter(function (f) { return f.path !== a.path; });
      touchFs();
      return {deleted: a.path};
    },
    files_mkdir: function (a) {
      var name = String(a.name || '').trim();
      if (!name || name.indexOf('/') >= 0) fail('folder name must be a plain name');
      if (S.files.folders.indexOf(name) >= 0) fail('folder ' + name + ' exists');
      S.files.folders.push(name); touchFs();
      return {created: name};
    },
    files_find: function (a) {
      var q = norm(a.name);
      return S.files.files.filter(function (f) { return norm(baseName(f.path)).indexOf(q) >= 0; }).map(function (f) { return f.path; });
    },
    sheet_get_range: function (a) { return rangeRefs(a.range).map(function (r) { return r.map(cell); }); },
    sheet_set_cell: function (a) {
      var c = cellRef(a.cell);
      if (c.row > S.sheet.rows) fail('row ' + c.row + ' does not exist (rows 1-' + S.sheet.rows + ')');
      S.sheet.cells[c.col + c.row] = String(a.value);
      return {cell: c.col + c.row, value: String(a.value)};
    },
    sheet_set_range: function (a) {
      var refs = rangeRefs(a.range);
      var rows = String(a.values).split(';').map(function (r) { return r.split(','); });
      var single = rows.length === 1 && rows[0].length === 1;
      if (!single && (rows.length !== refs.length || rows.some(function (r) { return r.length !== refs[0].length; }))) {
        fail('values shape ' + rows.length + 'x' + rows[0].length + ' does not match range ' + refs.length + 'x' + refs[0].length);
      }
      refs.forEach(function (line, i) { line.forEach(function (ref, j) { S.sheet.cells[ref] = single ? rows[0][0].trim() : rows[i][j].trim(); }); });
      return {updated: refs.length * refs[0].length};
    },
    sheet_sort: function (a) {
      var col = cellRef(String(a.column) + '1').col, desc = a.descending === true || norm(a.descending) === 'true';
      var rows = [];
      for (var r = 2; r <= S.sheet.rows; r++) rows.push(COLS.map(function (c) { return cell(c + r); }));
      var idx = COLS.indexOf(col);
      rows.sort(function (x, y) {
        var nx = parseFloat(x[idx]), ny = parseFloat(y[idx]);
        var d = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x[idx]).localeCompare(String(y[idx]));
        return desc ? -d : d;
      });
      rows.forEach(function (line, i) { COLS.forEach(function (c, j) { S.sheet.cells[c + (i + 2)] = line[j]; }); });
      return {sorted_by: col, descending: desc};
    },
    sheet_sum: function (a) {
      var total = 0;
      rangeRefs(a.range).forEach(function (r) { r.forEach(function (ref) { var v = parseFloat(cell(ref)); if (!isNaN(v)) total += v; }); });
      return Math.round(total * 100) / 100;
    },
    sheet_append_row: function (a) {
      var vals = String(a.values).split(',');
      if (vals.length > COLS.length) fail('at most ' + COLS.length + ' values');
      S.sheet.rows += 1;
      vals.forEach(function (v, i) { S.sheet.cells[COLS[i] + S.sheet.rows] = v.trim(); });
      return {row: S.sheet.rows};
    },
    settings_get: function (a) {
      if (!(a.key in S.settings)) fail('unknown setting ' + JSON.stringify(a.key));
      return S.settings[a.key];
    },
    settings_set: function (a) { S.settings[a.key] = checkSetting(a.key, a.value); return {key: a.key, value: S.settings[a.key]}; },
    settings_apply: function (a) {
      var pairs = String(a.changes).split(';').filter(function (p) { return p.trim(); }).map(function (p) {
        var i = p.indexOf('=');
        if (i < 0) fail('changes must look like key=value;key=value, got ' + JSON.stringify(p));
        var key = p.slice(0, i).trim();
        return [key, checkSetting(key, p.slice(i + 1).trim())];
      });
      pairs.forEach(function (kv) { S.settings[kv[0]] = kv[1]; });  // all-or-nothing: validated first
      return {applied: pairs.length};
    },
    calendar_list: function (a) {
      return sortedEvents().filter(function (e) { return !a.date || e.date === String(a.date).trim(); })
        .map(function (e) { return {title: e.title, date: e.date, time: e.time}; });
    },
    calendar_add: function (a) { var e = addEvent(a.title, a.date, a.time); return {title: e.title, date: e.date, time: e.time}; },
    calendar_delete: function (a) {
      if (!a.title && !a.date) fail('give title or date');
      var keep = S.calendar.events.filter(function (e) {
        return !((!a.title || norm(e.title) === norm(a.title)) && (!a.date || e.date === String(a.date).trim()));
      });
      var n = S.calendar.events.length - keep.length;
      if (!n) fail('no matching event');
      S.calendar.events = keep;
      return {deleted: n};
    },
    calendar_move: function (a) { eventsTitled(a.title).forEach(function (e) { setEventDate(e, a.date); }); return {moved: a.title, date: a.date}; }
  };

  // --- entry points for Python -----------------------------------------------------------------
  return {
    OPTIONS: OPTIONS, COLS: COLS,
    blankState: blankState,
    state: function () { return S; },
    reset: function (template, seed) {
      var task = TASKS[template];
      if (!task) return {error: 'unknown template ' + template};
      // A focused, edited field fires 'change' when the re-render removes it; let that land in the
      // old episode's state, not the new one.
      if (document.activeElement && document.activeElement.blur) document.activeElement.blur();
      S = blankState();
      fsVersion++;
      var rand = makeRng(template + '#' + seed);
      var inst = task.gen(rand, S);
      S.app = inst.start_app || 'home';
      S.goal = inst.goal;
      S.template = template;
      render();
      var plans = {gui: inst.gui, tool: inst.tool};
      return {instruction: inst.instruction, apps: task.apps, tool_beneficial: task.tool_beneficial, plans: plans,
              ref_steps: {gui: plans.gui.length, tool: plans.tool.length}, questions: inst.questions || null};
    },
    callTool: function (name, args) {
      if (!API[name]) return {success: false, result: null, error_message: 'unknown tool ' + name};
      try {
        var result = API[name](args || {});
        render();
        return {success: true, result: result === undefined ? null : result, error_message: ''};
      } catch (err) {
        return {success: false, result: null, error_message: String(err.message || err)};
      }
    },
    answer: function (text) { S.answer = String(text); },
    verify: function () { return !!TASKS[S.template].check(S, S.goal); },
    fsVersion: function () { return fsVersion; },
    fsSnapshot: function () { return {folders: S.files.folders.slice(), files: S.files.files.map(function (f) { return {path: f.path, content: f.content}; })}; },
    dump: function () {
      return {template: S.template, app: S.app, answer: S.answer, mail: S.mail.messages, files: this.fsSnapshot(),
              sheet: {rows: S.sheet.rows, cells: S.sheet.cells}, settings: S.settings, calendar: S.calendar.events};
    },
    render: render
  };
})();

// Seeded PRNG (mulberry32 over a string hash): the same (template, seed) gives the same task.
function makeRng(text) {
  var h = 1779033703 ^ text.length;
  for (var i = 0; i < text.length; i++) { h = Math.imul(h ^ text.charCodeAt(i), 3432918353); h = (h << 13) | (h >>> 19); }
  var a = h >>> 0;
  function next() {
    a = (a + 0x6D2B79F5) | 0;
    var t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  next.int = function (lo, hi) { return lo + Math.floor(next() * (hi - lo + 1)); };
  next.pick = function (list) { return list[Math.floor(next() * list.length)]; };
  next.sample = function (list, n) {
    var copy = list.slice(), out = [];
    while (out.length < n && copy.length) out.push(copy.splice(Math.floor(next() * copy.length), 1)[0]);
    return out;
  };
  return next;
}
