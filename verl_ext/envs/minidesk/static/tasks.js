// MiniDesk task templates. Each template: apps, tool_beneficial (does the tool path take fewer
// steps than the GUI path?), gen(rand, S) -> {instruction, goal, gui, tool, questions, start_app?} and
// check(S, goal) -> bool, the in-page verifier. `questions` are DVReward questions about the final
// state (see "DVReward questions" below). `gui` and `tool` are reference plans: `gui` uses GUI
// primitives only; `tool` prefers tools and falls back to GUI where no tool helps. A plan step is
// {gui: 'click'|'type'|'select'|'answer', k?: element key, text?} or {tool: name, args}.
'use strict';

var PEOPLE = ['Alice Moreau', 'Bob Tanaka', 'Carla Diaz', 'Deepak Rao', 'Eva Novak', 'Farid Haddad', 'Grace Kim',
              'Hugo Berg', 'Ines Silva', 'Jonas Weber', 'Kaito Sato', 'Lena Fischer'];
var SUBJECTS = ['Budget review', 'Lunch on Friday', 'Server maintenance', 'Quarterly report', 'Team offsite',
                'Invoice 4471', 'Holiday schedule', 'New hire onboarding', 'Design feedback', 'Contract renewal',
                'Travel booking', 'Security training', 'Product launch', 'Weekly sync notes'];
var WORDS = ['alpha', 'maple', 'river', 'copper', 'signal', 'harbor', 'velvet', 'orbit', 'cedar', 'lumen', 'quartz', 'tundra'];
var ITEMS = ['Pens', 'Paper', 'Stapler', 'Folders', 'Markers', 'Tape', 'Binders', 'Clips', 'Envelopes', 'Labels'];
var REGIONS = ['North', 'South', 'East', 'West'];
var EVENTS = ['Standup', 'Design review', 'Dentist', 'Gym', '1:1 with manager', 'Budget meeting', 'Lunch with Sam',
              'Code review', 'Project kickoff', 'Yoga class'];
var FOLDERS = ['Documents', 'Reports', 'Photos', 'Archive', 'Downloads'];
var FILE_NAMES = ['notes.txt', 'todo.md', 'budget.csv', 'minutes.txt', 'draft.md', 'summary.txt', 'plan.md', 'ideas.txt'];

// --- fixture builders --------------------------------------------------------------------------
function seedMail(r, S, n, extra) {
  var people = r.sample(PEOPLE, 6), subjects = r.sample(SUBJECTS, n);
  for (var i = 0; i < n; i++) {
    S.mail.messages.push({id: S.mail.nextId++, from: r.pick(people), to: 'me@minidesk.local', subject: subjects[i],
      body: 'Hi, a short note about ' + subjects[i].toLowerCase() + ' (' + r.pick(WORDS) + ').', folder: 'inbox',
      read: r() < 0.5, starred: false});
  }
  (extra || []).forEach(function (m) {
    S.mail.messages.splice(r.int(0, S.mail.messages.length), 0, Object.assign({id: S.mail.nextId++, to: 'me@minidesk.local',
      folder: 'inbox', read: false, starred: false}, m));
  });
  return S.mail.messages;
}
function mailFrom(S, sender) { return S.mail.messages.filter(function (m) { return m.from === sender && m.folder !== 'sent'; }); }
function seedFiles(r, S) {
  S.files.folders = r.sample(FOLDERS, 4);
  S.files.folders.forEach(function (d) {
    r.sample(FILE_NAMES, r.int(2, 3)).forEach(function (name) {
      S.files.files.push({path: d + '/' + name, content: r.pick(WORDS) + ' ' + r.pick(WORDS) + ' ' + r.int(10, 99)});
    });
  });
  return S.files;
}
function seedSheet(r, S, n) {
  var items = r.sample(ITEMS, n), qty = r.sample([3, 5, 8, 12, 15, 20, 25, 30, 42, 50], n);
  S.sheet.cells = {A1: 'Item', B1: 'Qty', C1: 'Price', D1: 'Region'};
  for (var i = 0; i < n; i++) {
    var row = i + 2;
    S.sheet.cells['A' + row] = items[i];
    S.sheet.cells['B' + row] = String(qty[i]);
    S.sheet.cells['C' + row] = (r.int(100, 999) / 100).toFixed(2);
    S.sheet.cells['D' + row] = r.pick(REGIONS);
  }
  S.sheet.rows = n + 1;
  return n + 1;
}
function seedCalendar(r, S, n) {
  var titles = r.sample(EVENTS, n);
  titles.forEach(function (t) {
    S.calendar.events.push({id: S.calendar.nextId++, title: t, date: '2026-03-0' + r.int(2, 6),
                            time: (r.int(8, 17) + '').padStart(2, '0') + ':' + r.pick(['00', '30'])});
  });
  return S.calendar.events;
}
function column(S, col, last) { var v = []; for (var r = 2; r <= last; r++) v.push(S.sheet.cells[col + r] || ''); return v; }
function total(values) { return Math.round(values.reduce(function (a, v) { return a + (parseFloat(v) || 0); }, 0) * 100) / 100; }

// --- plan steps -------------------------------------------------------------------------------
function open(app) { return {gui: 'click', k: 'app-' + app}; }
function click(key) { return {gui: 'click', k: key}; }
function type(key, text) { return {gui: 'type', k: key, text: String(text)}; }
function choose(key, text) { return {gui: 'select', k: key, text: String(text)}; }
function answer(text) { return {gui: 'answer', text: String(text)}; }
function tool(name, args) { return {tool: name, args: args}; }
function composeSteps(to, subject, body) {
  return [click('mail-compose'), type('compose-to', to), type('compose-subject', subject), type('compose-body', body), click('compose-send')];
}

// --- verifier helpers -------------------------------------------------------------------------
function same(a, b) {
  var x = String(a === null || a === undefined ? '' : a).trim().toLowerCase(), y = String(b).trim().toLowerCase();
  if (x !== '' && !isNaN(+x) && !isNaN(+y)) return Math.abs(+x - +y) < 1e-6;
  return x === y;
}
function sentTo(S, to, subject, bodyCheck) {
  return S.mail.messages.some(function (m) {
    return m.folder === 'sent' && same(m.to, to) && same(m.subject, subject) && bodyCheck(m.body);
  });
}
function fileAt(S, path) { return S.files.files.filter(function (f) { return f.path === path; })[0]; }

// --- DVReward questions -----------------------------------------------------------------------
// gen() also returns `questions`: atomic yes/no questions about the FINAL state, answerable from the
// state dump (MiniDeskEnv.state_dump; the agent loop stores it as extras.artifact.state) by a
// DVReward judge (docs/plugins/dvreward.md). They restate check(): a state that passes check()
// answers yes to every question, a state that fails it answers no to at least one. `parents` (DSG)
// index earlier questions of the same list; `kind` is 'semantic' (the requested change) or
// 'quality' (a collateral change that check() also forbids). Where check() compares with same(),
// the question says "ignoring letter case" or asks for "the number N"; elsewhere it is exact.
function ask(qs, text, parents, kind) {
  qs.push({text: text, kind: kind || 'semantic', parents: parents || []});
  return qs.length - 1;
}
function isNumber(v) { var s = String(v).trim(); return s !== '' && !isNaN(+s); }
function askAnswer(qs, value) {
  var i = ask(qs, 'Has an answer been submitted?');
  ask(qs, isNumber(value) ? 'Is the submitted answer the number ' + value + ' and nothing else?'
                          : 'Is the submitted answer exactly "' + value + '" (ignoring letter case)?', [i]);
  return qs;
}
// sentTo(S, to, subject, body check): address, then subject, then body, each gated on the previous.
function askSent(qs, to, subject, body, contains) {
  var i = ask(qs, 'Is there an email in the Sent folder addressed to ' + to + '?');
  var base = 'Is there a sent email to ' + to + ' with the subject "' + subject + '"';
  var j = ask(qs, base + ' (ignoring letter case)?', [i]);
  ask(qs, contains ? base + ' (ignoring letter case) whose body contains "' + body + '"?'
        : isNumber(body) ? base + ' (ignoring letter case) whose body is the number ' + body + '?'
        : base + ' and the body "' + body + '" (both ignoring letter case)?', [j]);
  return qs;
}
function askCell(qs, ref, value) {
  ask(qs, String(value).trim() === '' ? 'Is cell ' + ref + ' empty?'
        : isNumber(value) ? 'Does cell ' + ref + ' hold the number ' + value + '?'
        : 'Does cell ' + ref + ' hold "' + value + '" (ignoring letter case)?');
  return qs;
}
function askSetting(qs, key, value) {
  ask(qs, 'Is the ' + (key === 'timezone' ? 'time zone' : key) + ' setting "' + value + '"?');
  return qs;
}
function askToggle(qs, key, on) {
  ask(qs, (key === 'notifications' ? 'Are notifications' : 'Is ' + key) + ' turned ' + (on ? 'on' : 'off') + '?');
  return qs;
}
function askEvent(qs, title, date, time) {
  var base = 'Is there a calendar event titled "' + title + '" (ignoring letter case)';
  var i = ask(qs, base + '?'), j = ask(qs, base + ' dated ' + date + '?', [i]);
  ask(qs, base + ' dated ' + date + ' at ' + time + '?', [j]);
  return qs;
}
function askFileCount(qs, n) { ask(qs, 'Are there exactly ' + n + ' files in total across all folders?', [], 'quality'); return qs; }
function askEventCount(qs, n) { ask(qs, 'Does the calendar hold exactly ' + n + ' events?', [], 'quality'); return qs; }

var TASKS = {
  // ---------------------------------------------------------------- mail
  mail_star_sender: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      var sender = r.pick(PEOPLE.slice(6)), k = r.int(2, 3), extra = [];
      for (var i = 0; i < k; i++) extra.push({from: sender, subject: r.pick(SUBJECTS), body: 'Update ' + i});
      seedMail(r, S, 6, extra);
      var gui = [open('mail')].concat(mailFrom(S, sender).map(function (m) { return click('mail-star-' + m.id); }));
      var qs = [];
      ask(qs, 'Is every email from ' + sender + ' starred?');
      ask(qs, 'Is every email outside the Sent folder that is not from ' + sender + ' unstarred?', [], 'quality');
      return {instruction: 'Star every email from ' + sender + '.', goal: {sender: sender}, gui: gui,
              tool: [tool('mail_star', {sender: sender})], questions: qs};
    },
    check: function (S, g) { return S.mail.messages.every(function (m) { return m.folder === 'sent' || m.starred === (m.from === g.sender); }); }
  },
  mail_archive_sender: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      var sender = r.pick(PEOPLE.slice(6)), extra = [];
      for (var i = 0; i < r.int(2, 3); i++) extra.push({from: sender, subject: r.pick(SUBJECTS), body: 'Report ' + i});
      seedMail(r, S, 6, extra);
      var gui = [open('mail')];
      mailFrom(S, sender).forEach(function (m) { gui.push(click('mail-row-' + m.id), click('mail-archive')); });
      var qs = [];
      ask(qs, 'Is every email from ' + sender + ' in the Archive folder?');
      ask(qs, 'Is every email not from ' + sender + ' in the Inbox?', [], 'quality');
      return {instruction: 'Move all emails from ' + sender + ' to the Archive folder.', goal: {sender: sender}, gui: gui,
              tool: [tool('mail_move', {sender: sender, folder: 'archive'})], questions: qs};
    },
    check: function (S, g) { return S.mail.messages.every(function (m) { return m.folder === (m.from === g.sender ? 'archive' : 'inbox'); }); }
  },
  mail_delete_subject: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      var msgs = seedMail(r, S, 7), m = r.pick(msgs);
      var qs = [];
      ask(qs, 'Is the email with the subject "' + m.subject + '" in the Trash folder?');
      ask(qs, 'Is every email other than the one with the subject "' + m.subject + '" in the Inbox?', [], 'quality');
      return {instruction: 'Delete the email with the subject "' + m.subject + '".', goal: {id: m.id},
              gui: [open('mail'), click('mail-row-' + m.id), click('mail-delete')],
              tool: [tool('mail_move', {subject: m.subject, folder: 'trash'})], questions: qs};
    },
    check: function (S, g) { return S.mail.messages.every(function (m) { return m.folder === (m.id === g.id ? 'trash' : 'inbox'); }); }
  },
  mail_open: {
    apps: ['mail'], tool_beneficial: false,
    gen: function (r, S) {
      var m = r.pick(seedMail(r, S, 7));
      var plan = [open('mail'), click('mail-row-' + m.id)];
      var qs = [], app = ask(qs, 'Is the Mail app shown on screen?');
      ask(qs, 'Is the email from ' + m.from + ' with the subject "' + m.subject + '" open in the Mail app?', [app]);
      return {instruction: 'Open the email from ' + m.from + ' with the subject "' + m.subject + '" so it is shown on screen.',
              goal: {id: m.id}, gui: plan, tool: plan, questions: qs};
    },
    check: function (S, g) { return S.app === 'mail' && S.mail.open === g.id; }
  },
  mail_send: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      seedMail(r, S, 5);
      var to = r.pick(WORDS) + '@corp.test', subject = r.pick(SUBJECTS), body = 'Please review the ' + r.pick(WORDS) + ' plan.';
      return {instruction: 'Send an email to ' + to + ' with the subject "' + subject + '" and the body "' + body + '".',
              goal: {to: to, subject: subject, body: body}, gui: [open('mail')].concat(composeSteps(to, subject, body)),
              tool: [tool('mail_send', {to: to, subject: subject, body: body})], questions: askSent([], to, subject, body)};
    },
    check: function (S, g) { return sentTo(S, g.to, g.subject, function (b) { return same(b, g.body); }); }
  },
  mail_reply: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      var m = r.pick(seedMail(r, S, 6)), body = 'Thanks, ' + r.pick(WORDS) + ' works for me.';
      return {instruction: 'Reply to the email "' + m.subject + '" from ' + m.from + ' with the text "' + body + '".',
              goal: {to: m.from, subject: 'Re: ' + m.subject, body: body},
              gui: [open('mail'), click('mail-row-' + m.id), click('mail-reply'), type('compose-body', body), click('compose-send')],
              tool: [tool('mail_send', {to: m.from, subject: 'Re: ' + m.subject, body: body})],
              questions: askSent([], m.from, 'Re: ' + m.subject, body)};
    },
    check: function (S, g) { return sentTo(S, g.to, g.subject, function (b) { return same(b, g.body); }); }
  },
  mail_count_unread: {
    apps: ['mail'], tool_beneficial: false,
    gen: function (r, S) {
      var n = seedMail(r, S, 8).filter(function (m) { return !m.read; }).length;
      return {instruction: 'How many unread emails are in the Inbox? Answer with the number only.', goal: {n: n},
              gui: [open('mail'), answer(n)], tool: [tool('mail_search', {query: '', folder: 'inbox'}), answer(n)],
              questions: askAnswer([], n)};
    },
    check: function (S, g) { return same(S.answer, g.n); }
  },
  mail_mark_all_read: {
    apps: ['mail'], tool_beneficial: false,
    gen: function (r, S) {
      seedMail(r, S, 7)[0].read = false;
      var plan = [open('mail'), click('mail-markall')];
      return {instruction: 'Mark every email in the Inbox as read.', goal: {}, gui: plan, tool: plan,
              questions: [{text: 'Is every email in the Inbox marked as read?', kind: 'semantic', parents: []}]};
    },
    check: function (S) { return S.mail.messages.every(function (m) { return m.folder !== 'inbox' || m.read; }); }
  },
  mail_forward: {
    apps: ['mail'], tool_beneficial: true,
    gen: function (r, S) {
      var m = r.pick(seedMail(r, S, 6)), to = r.pick(WORDS) + '@partner.test';
      return {instruction: 'Forward the email "' + m.subject + '" to ' + to + ' (subject "Fwd: ' + m.subject + '", original text as body).',
              goal: {to: to, subject: 'Fwd: ' + m.subject, body: m.body},
              gui: [open('mail'), click('mail-row-' + m.id), click('mail-forward'), type('compose-to', to), click('compose-send')],
              tool: [tool('mail_search', {query: m.subject}), tool('mail_send', {to: to, subject: 'Fwd: ' + m.subject, body: m.body})],
              questions: askSent([], to, 'Fwd: ' + m.subject, m.body, true)};
    },
    check: function (S, g) { return sentTo(S, g.to, g.subject, function (b) { return String(b).indexOf(g.body) >= 0; }); }
  },
  // ---------------------------------------------------------------- files
  files_rename: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      var f = r.pick(seedFiles(r, S).files), dir = f.path.split('/')[0], name = r.pick(WORDS) + '-final.txt';
      var qs = [], at = ask(qs, 'Is there a file at the path ' + dir + '/' + name + '?');
      ask(qs, 'Is the content of the file ' + dir + '/' + name + ' exactly "' + f.content + '"?', [at]);
      ask(qs, 'Is the file ' + f.path + ' absent from the file system?');
      return {instruction: 'Rename the file ' + f.path + ' to ' + name + ' (same folder).', goal: {from: f.path, to: dir + '/' + name, content: f.content},
              gui: [open('files'), click('files-folder-' + dir), click('files-rename-' + f.path), type('files-rename-input', name), click('files-rename-ok')],
              tool: [tool('files_rename', {path: f.path, new_name: name})], questions: qs};
    },
    check: function (S, g) { var f = fileAt(S, g.to); return !fileAt(S, g.from) && !!f && f.content === g.content; }
  },
  files_move_ext: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      seedFiles(r, S);
      var src = S.files.folders[0], dest = S.files.folders[1], logs = [];
      for (var i = 0, n = r.int(2, 3); i < n; i++) {
        var p = src + '/' + r.pick(WORDS) + '-' + i + '.log';
        S.files.files.push({path: p, content: 'log ' + i}); logs.push(p);
      }
      var gui = [open('files'), click('files-folder-' + src)];
      logs.forEach(function (p) { gui.push(choose('files-move-select-' + p, dest), click('files-move-' + p)); });
      var qs = [];
      logs.forEach(function (p) { ask(qs, 'Is there a file named ' + p.split('/')[1] + ' in the folder ' + dest + '?'); });
      return {instruction: 'Move every .log file from the folder ' + src + ' into the folder ' + dest + '.',
              goal: {logs: logs, dest: dest, count: S.files.files.length}, gui: gui,
              tool: logs.map(function (p) { return tool('files_move', {path: p, folder: dest}); }),
              questions: askFileCount(qs, S.files.files.length)};
    },
    check: function (S, g) {
      return S.files.files.length === g.count && g.logs.every(function (p) { return !!fileAt(S, g.dest + '/' + p.split('/')[1]); });
    }
  },
  files_delete: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      var files = seedFiles(r, S).files, f = r.pick(files);
      var qs = [];
      ask(qs, 'Is the file ' + f.path + ' absent from the file system?');
      return {instruction: 'Delete the file ' + f.path + '.', goal: {path: f.path, count: files.length - 1},
              gui: [open('files'), click('files-folder-' + f.path.split('/')[0]), click('files-delete-' + f.path)],
              tool: [tool('files_delete', {path: f.path})], questions: askFileCount(qs, files.length - 1)};
    },
    check: function (S, g) { return !fileAt(S, g.path) && S.files.files.length === g.count; }
  },
  files_create: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      var dir = r.pick(seedFiles(r, S).folders), name = r.pick(WORDS) + '.txt', text = 'Remember the ' + r.pick(WORDS) + ' meeting';
      var qs = [], at = ask(qs, 'Is there a file at the path ' + dir + '/' + name + '?');
      ask(qs, 'Is the content of the file ' + dir + '/' + name + ' exactly "' + text + '" (ignoring letter case)?', [at]);
      return {instruction: 'Create a text file named ' + name + ' in the folder ' + dir + ' containing exactly "' + text + '".',
              goal: {path: dir + '/' + name, text: text},
              gui: [open('files'), click('files-folder-' + dir), click('files-newfile'), type('newfile-name', name),
                    type('newfile-content', text), click('newfile-create')],
              tool: [tool('files_write', {path: dir + '/' + name, content: text})], questions: qs};
    },
    check: function (S, g) { var f = fileAt(S, g.path); return !!f && same(f.content, g.text); }
  },
  files_read_answer: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      var f = r.pick(seedFiles(r, S).files);
      return {instruction: 'What does the file ' + f.path + ' contain? Answer with its exact content.', goal: {text: f.content},
              gui: [open('files'), click('files-folder-' + f.path.split('/')[0]), click('files-open-' + f.path), answer(f.content)],
              tool: [tool('files_read', {path: f.path}), answer(f.content)], questions: askAnswer([], f.content)};
    },
    check: function (S, g) { return same(S.answer, g.text); }
  },
  files_open_folder: {
    apps: ['files'], tool_beneficial: false,
    gen: function (r, S) {
      var dir = r.pick(seedFiles(r, S).folders), plan = [open('files'), click('files-folder-' + dir)];
      var qs = [], app = ask(qs, 'Is the Files app shown on screen?');
      ask(qs, 'Is the folder ' + dir + ' open in the Files app?', [app]);
      return {instruction: 'Open the folder ' + dir + ' in the Files app.', goal: {dir: dir}, gui: plan, tool: plan, questions: qs};
    },
    check: function (S, g) { return S.app === 'files' && S.files.cwd === g.dir; }
  },
  files_mkdir: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      seedFiles(r, S);
      var name = cap2(r.pick(WORDS)) + ' ' + r.int(2024, 2027);
      return {instruction: 'Create a new folder named "' + name + '".', goal: {name: name},
              gui: [open('files'), type('files-newfolder-name', name), click('files-mkdir')],
              tool: [tool('files_mkdir', {name: name})],
              questions: [{text: 'Is there a folder named "' + name + '"?', kind: 'semantic', parents: []}]};
    },
    check: function (S, g) { return S.files.folders.indexOf(g.name) >= 0; }
  },
  files_find_answer: {
    apps: ['files'], tool_beneficial: true,
    gen: function (r, S) {
      seedFiles(r, S);
      var dir = r.pick(S.files.folders), name = r.pick(WORDS) + '-' + r.int(100, 999) + '.pdf';
      S.files.files.push({path: dir + '/' + name, content: '%PDF'});
      return {instruction: 'Which folder contains the file ' + name + '? Answer with the folder name only.', goal: {dir: dir},
              gui: [open('files'), click('files-folder-' + dir), answer(dir)],
              tool: [tool('files_find', {name: name}), answer(dir)], questions: askAnswer([], dir)};
    },
    check: function (S, g) { return same(S.answer, g.dir); }
  },
  // ---------------------------------------------------------------- sheet
  sheet_fill_column: {
    apps: ['sheet'], tool_beneficial: true,
    gen: function (r, S) {
      var last = seedSheet(r, S, r.int(4, 6)), gui = [open('sheet')];
      var value = r.pick(REGIONS.filter(function (x) { return x !== S.sheet.cells.D2; }));
      for (var row = 2; row <= last; row++) if (S.sheet.cells['D' + row] !== value) gui.push(type('cell-D' + row, value));
      var qs = [];
      for (var q = 2; q <= last; q++) askCell(qs, 'D' + q, value);
      return {instruction: 'Set every Region cell (D2 to D' + last + ') to "' + value + '".', goal: {value: value, last: last}, gui: gui,
              tool: [tool('sheet_set_range', {range: 'D2:D' + last, values: value})], questions: qs};
    },
    check: function (S, g) { return column(S, 'D', g.last).every(function (v) { return same(v, g.value); }); }
  },
  sheet_set_cell: {
    apps: ['sheet'], tool_beneficial: false,
    gen: function (r, S) {
      var last = seedSheet(r, S, 5), ref = 'C' + r.int(2, last), value = (r.int(100, 999) / 100).toFixed(2);
      return {instruction: 'Set cell ' + ref + ' to ' + value + '.', goal: {ref: ref, value: value}, start_app: 'sheet',
              gui: [type('cell-' + ref, value)], tool: [tool('sheet_set_cell', {cell: ref, value: value})],
              questions: askCell([], ref, value)};
    },
    check: function (S, g) { return same(S.sheet.cells[g.ref], g.value); }
  },
  sheet_sort: {
    apps: ['sheet'], tool_beneficial: true,
    gen: function (r, S) {
      var last = seedSheet(r, S, r.int(4, 6)), col = r.pick(['A', 'B']), desc = r() < 0.5;
      var rows = [];
      for (var row = 2; row <= last; row++) rows.push(['A', 'B', 'C', 'D'].map(function (c) { return S.sheet.cells[c + row]; }));
      var idx = col === 'A' ? 0 : 1;
      rows.sort(function (x, y) { var d = idx ? x[1] - y[1] : x[0].localeCompare(y[0]); return desc ? -d : d; });
      return {instruction: 'Sort the data rows by column ' + col + ' (' + (col === 'A' ? 'Item' : 'Qty') + ') in ' +
                (desc ? 'descending' : 'ascending') + ' order.', goal: {rows: rows},
              gui: [open('sheet'), choose('sheet-sort-col', col), choose('sheet-sort-order', desc ? 'desc' : 'asc'), click('sheet-sort')],
              tool: [tool('sheet_sort', {column: col, descending: desc})],
              questions: rows.map(function (line, i) {
                return {text: 'Does row ' + (i + 2) + ' of the sheet hold exactly Item "' + line[0] + '", Qty "' + line[1] +
                          '", Price "' + line[2] + '" and Region "' + line[3] + '"?', kind: 'semantic', parents: []};
              })};
    },
    check: function (S, g) {
      return g.rows.every(function (line, i) { return ['A', 'B', 'C', 'D'].every(function (c, j) { return S.sheet.cells[c + (i + 2)] === line[j]; }); });
    }
  },
  sheet_copy_column: {
    apps: ['sheet'], tool_beneficial: true,
    gen: function (r, S) {
      var last = seedSheet(r, S, r.int(3, 5)), values = column(S, 'B', last), gui = [open('sheet')];
      values.forEach(function (v, i) { gui.push(type('cell-D' + (i + 2), v)); });
      return {instruction: 'Copy the Qty values (B2 to B' + last + ') into column D (D2 to D' + last + '), row by row.',
              goal: {values: values, last: last}, gui: gui,
              tool: [tool('sheet_get_range', {range: 'B2:B' + last}), tool('sheet_set_range', {range: 'D2:D' + last, values: values.join(';')})],
              questions: values.reduce(function (qs, v, i) { return askCell(qs, 'D' + (i + 2), v); }, [])};
    },
    check: function (S, g) { return column(S, 'D', g.last).every(function (v, i) { return same(v, g.values[i]); }); }
  },
  sheet_sum_to_cell: {
    apps: ['sheet'], tool_beneficial: false,
    gen: function (r, S) {
      var last = seedSheet(r, S, r.int(3, 5)), sum = total(column(S, 'B', last)), ref = 'B' + (last + 1);
      S.sheet.rows = last + 1;
      S.sheet.cells['A' + (last + 1)] = 'Total';
      return {instruction: 'Write the total of the Qty column (B2 to B' + last + ') into cell ' + ref + '.', goal: {ref: ref, sum: sum},
              gui: [open('sheet'), type('cell-' + ref, sum)],
              tool: [tool('sheet_sum', {range: 'B2:B' + last}), tool('sheet_set_cell', {cell: ref, value: String(sum)})],
              questions: askCell([], ref, sum)};
    },
    check: function (S, g) { return same(S.sheet.cells[g.ref], g.sum); }
  },
  sheet_clear_row: {
    apps: ['sheet'], tool_beneficial: true,
    gen: function (r, S) {
      var row = r.int(2, seedSheet(r, S, 5)), gui = [open('sheet')];
      ['A', 'B', 'C', 'D'].forEach(function (c) { gui.push(type('cell-' + c + row, '')); });
      return {instruction: 'Clear every cell of row ' + row + ' (A' + row + ' to D' + row + ') so they are empty.', goal: {row: row}, gui: gui,
              tool: [tool('sheet_set_range', {range: 'A' + row + ':D' + row, values: ''})],
              questions: ['A', 'B', 'C', 'D'].reduce(function (qs, c) { return askCell(qs, c + row, ''); }, [])};
    },
    check: function (S, g) { return ['A', 'B', 'C', 'D'].every(function (c) { return !String(S.sheet.cells[c + g.row] || '').trim(); }); }
  },
  sheet_add_row: {
    apps: ['sheet'], tool_beneficial: true,
    gen: function (r, S) {
      var last = seedSheet(r, S, 4), row = last + 1;
      var vals = [r.pick(['Scissors', 'Glue', 'Rulers', 'Erasers']), String(r.int(2, 60)), (r.int(100, 999) / 100).toFixed(2), r.pick(REGIONS)];
      var gui = [open('sheet'), click('sheet-addrow')];
      ['A', 'B', 'C', 'D'].forEach(function (c, i) { gui.push(type('cell-' + c + row, vals[i])); });
      return {instruction: 'Add a row at the bottom of the sheet with Item ' + vals[0] + ', Qty ' + vals[1] + ', Price ' + vals[2] +
                ' and Region ' + vals[3] + '.', goal: {row: row, vals: vals}, gui: gui,
              tool: [tool('sheet_append_row', {values: vals.join(',')})],
              questions: ['A', 'B', 'C', 'D'].reduce(function (qs, c, i) { return askCell(qs, c + row, vals[i]); }, [])};
    },
    check: function (S, g) { return ['A', 'B', 'C', 'D'].every(function (c, i) { return same(S.sheet.cells[c + g.row], g.vals[i]); }); }
  },
  // ---------------------------------------------------------------- settings
  settings_theme: {
    apps: ['settings'], tool_beneficial: false,
    gen: function (r, S) {
      S.settings.theme = r.pick(['light', 'dark']);
      var want = S.settings.theme === 'light' ? 'dark' : 'light';
      return {instruction: 'Switch the theme to ' + want + '.', goal: {theme: want}, start_app: 'settings',
              gui: [choose('set-theme', want)], tool: [tool('settings_set', {key: 'theme', value: want})],
              questions: askSetting([], 'theme', want)};
    },
    check: function (S, g) { return S.settings.theme === g.theme; }
  },
  settings_multi: {
    apps: ['settings'], tool_beneficial: true,
    gen: function (r, S) {
      var lang = r.pick(DESK.OPTIONS.language.slice(1)), tz = r.pick(DESK.OPTIONS.timezone.slice(1));
      return {instruction: 'In Settings, set the language to ' + lang + ', the time zone to ' + tz + ' and turn notifications off.',
              goal: {language: lang, timezone: tz},
              gui: [open('settings'), choose('set-language', lang), choose('set-timezone', tz), click('set-notifications')],
              tool: [tool('settings_apply', {changes: 'language=' + lang + ';timezone=' + tz + ';notifications=off'})],
              questions: askToggle(askSetting(askSetting([], 'language', lang), 'timezone', tz), 'notifications', false)};
    },
    check: function (S, g) { return S.settings.language === g.language && S.settings.timezone === g.timezone && S.settings.notifications === false; }
  },
  settings_toggle: {
    apps: ['settings'], tool_beneficial: false,
    gen: function (r, S) {
      var key = r.pick(['notifications', 'autosave']), want = !S.settings[key];
      return {instruction: 'Turn ' + (want ? 'on' : 'off') + ' ' + key + '.', goal: {key: key, value: want}, start_app: 'settings',
              gui: [click('set-' + key)], tool: [tool('settings_set', {key: key, value: want ? 'on' : 'off'})],
              questions: askToggle([], key, want)};
    },
    check: function (S, g) { return S.settings[g.key] === g.value; }
  },
  settings_font_answer: {
    apps: ['settings'], tool_beneficial: false,
    gen: function (r, S) {
      S.settings.font_size = r.pick(DESK.OPTIONS.font_size);
      return {instruction: 'What is the current font size setting? Answer with the number only.', goal: {size: S.settings.font_size},
              gui: [open('settings'), answer(S.settings.font_size)],
              tool: [tool('settings_get', {key: 'font_size'}), answer(S.settings.font_size)],
              questions: askAnswer([], S.settings.font_size)};
    },
    check: function (S, g) { return same(S.answer, g.size); }
  },
  // ---------------------------------------------------------------- calendar
  calendar_add: {
    apps: ['calendar'], tool_beneficial: true,
    gen: function (r, S) {
      seedCalendar(r, S, 4);
      var title = r.pick(['Planning', 'Retro', 'Coffee chat', 'Demo day']) + ' ' + r.int(1, 9), date = '2026-04-' + r.int(10, 28);
      var time = (r.int(9, 16) + '').padStart(2, '0') + ':' + r.pick(['00', '15', '30']);
      return {instruction: 'Add a calendar event "' + title + '" on ' + date + ' at ' + time + '.', goal: {title: title, date: date, time: time},
              gui: [open('calendar'), type('cal-new-title', title), type('cal-new-date', date), type('cal-new-time', time), click('cal-add')],
              tool: [tool('calendar_add', {title: title, date: date, time: time})], questions: askEvent([], title, date, time)};
    },
    check: function (S, g) { return S.calendar.events.some(function (e) { return same(e.title, g.title) && e.date === g.date && e.time === g.time; }); }
  },
  calendar_delete_title: {
    apps: ['calendar'], tool_beneficial: false,
    gen: function (r, S) {
      var events = seedCalendar(r, S, 5), e = r.pick(events);
      return {instruction: 'Delete the event "' + e.title + '".', goal: {title: e.title, count: events.length - 1}, start_app: 'calendar',
              gui: [click('cal-delete-' + e.id)], tool: [tool('calendar_delete', {title: e.title})],
              questions: askEventCount([{text: 'Is the calendar free of any event titled "' + e.title + '"?', kind: 'semantic', parents: []}],
                                       events.length - 1)};
    },
    check: function (S, g) { return S.calendar.events.length === g.count && !S.calendar.events.some(function (e) { return e.title === g.title; }); }
  },
  calendar_reschedule: {
    apps: ['calendar'], tool_beneficial: true,
    gen: function (r, S) {
      var e = r.pick(seedCalendar(r, S, 5)), date = '2026-03-' + r.int(10, 27);
      return {instruction: 'Move the event "' + e.title + '" to ' + date + ' (keep its time).', goal: {id: e.id, date: date, time: e.time},
              gui: [open('calendar'), click('cal-edit-' + e.id), type('cal-edit-date', date), click('cal-edit-save')],
              tool: [tool('calendar_move', {title: e.title, date: date})],
              questions: [{text: 'Is the calendar event "' + e.title + '" (id ' + e.id + ') dated ' + date + '?', kind: 'semantic', parents: []},
                          {text: 'Is the calendar event "' + e.title + '" (id ' + e.id + ') scheduled at ' + e.time + '?', kind: 'semantic', parents: []}]};
    },
    check: function (S, g) { return S.calendar.events.some(function (e) { return e.id === g.id && e.date === g.date && e.time === g.time; }); }
  },
  calendar_clear_day: {
    apps: ['calendar'], tool_beneficial: true,
    gen: function (r, S) {
      var events = seedCalendar(r, S, 6), date = events[0].date;
      events[1].date = date;
      var doomed = events.filter(function (e) { return e.date === date; });
      return {instruction: 'Delete every event on ' + date + '.', goal: {date: date, count: events.length - doomed.length},
              gui: [open('calendar')].concat(doomed.map(function (e) { return click('cal-delete-' + e.id); })),
              tool: [tool('calendar_delete', {date: date})],
              questions: askEventCount([{text: 'Is the calendar free of any event on ' + date + '?', kind: 'semantic', parents: []}],
                                       events.length - doomed.length)};
    },
    check: function (S, g) { return S.calendar.events.length === g.count && S.calendar.events.every(function (e) { return e.date !== g.date; }); }
  },
  calendar_count_answer: {
    apps: ['calendar'], tool_beneficial: false,
    gen: function (r, S) {
      var events = seedCalendar(r, S, 6), date = r.pick(events).date;
      var n = events.filter(function (e) { return e.date === date; }).length;
      return {instruction: 'How many events are scheduled on ' + date + '? Answer with the number only.', goal: {n: n},
              gui: [open('calendar'), answer(n)], tool: [tool('calendar_list', {date: date}), answer(n)], questions: askAnswer([], n)};
    },
    check: function (S, g) { return same(S.answer, g.n); }
  },
  // ---------------------------------------------------------------- across apps
  mail_to_calendar: {
    apps: ['mail', 'calendar'], tool_beneficial: true,
    gen: function (r, S) {
      var sender = r.pick(PEOPLE.slice(6)), title = r.pick(['Roadmap review', 'Vendor call', 'Budget sync']);
      var date = '2026-05-' + r.int(10, 28), time = (r.int(9, 16) + '').padStart(2, '0') + ':00';
      seedMail(r, S, 5, [{from: sender, subject: 'Meeting request', body: 'Can we meet on ' + date + ' at ' + time + '? Title: ' + title + '.'}]);
      var m = mailFrom(S, sender).filter(function (x) { return x.subject === 'Meeting request'; })[0];
      return {instruction: sender + ' asked for a meeting by email. Add it to the calendar with the title, date and time given in the email.',
              goal: {title: title, date: date, time: time},
              gui: [open('mail'), click('mail-row-' + m.id), open('calendar'), type('cal-new-title', title), type('cal-new-date', date),
                    type('cal-new-time', time), click('cal-add')],
              tool: [tool('mail_search', {query: 'Meeting request'}), tool('calendar_add', {title: title, date: date, time: time})],
              questions: askEvent([], title, date, time)};
    },
    check: function (S, g) { return TASKS.calendar_add.check(S, g); }
  },
  sheet_to_mail: {
    apps: ['sheet', 'mail'], tool_beneficial: true,
    gen: function (r, S) {
      var last = seedSheet(r, S, r.int(3, 5)), sum = total(column(S, 'B', last)), to = r.pick(WORDS) + '@corp.test';
      return {instruction: 'Email the total Qty (sum of B2 to B' + last + ' in the sheet) to ' + to + ' with the subject "Total" and the number as the body.',
              goal: {to: to, sum: sum},
              gui: [open('sheet'), open('mail')].concat(composeSteps(to, 'Total', sum)),
              tool: [tool('sheet_sum', {range: 'B2:B' + last}), tool('mail_send', {to: to, subject: 'Total', body: String(sum)})],
              questions: askSent([], to, 'Total', sum)};
    },
    check: function (S, g) { return sentTo(S, g.to, 'Total', function (b) { return same(b, g.sum); }); }
  },
  files_to_mail: {
    apps: ['files', 'mail'], tool_beneficial: true,
    gen: function (r, S) {
      var f = r.pick(seedFiles(r, S).files), name = f.path.split('/')[1], to = r.pick(WORDS) + '@corp.test';
      return {instruction: 'Email the content of the file ' + f.path + ' to ' + to + ' with the subject "' + name + '".',
              goal: {to: to, subject: name, text: f.content},
              gui: [open('files'), click('files-folder-' + f.path.split('/')[0]), click('files-open-' + f.path), open('mail')]
                .concat(composeSteps(to, name, f.content)),
              tool: [tool('files_read', {path: f.path}), tool('mail_send', {to: to, subject: name, body: f.content})],
              questions: askSent([], to, name, f.content)};
    },
    check: function (S, g) { return sentTo(S, g.to, g.subject, function (b) { return same(b, g.text); }); }
  },
  settings_from_mail: {
    apps: ['mail', 'settings'], tool_beneficial: true,
    gen: function (r, S) {
      var tz = r.pick(DESK.OPTIONS.timezone.slice(1));
      seedMail(r, S, 5, [{from: 'IT Support', subject: 'Time zone policy', body: 'Please set your time zone to ' + tz + '.'}]);
      var m = mailFrom(S, 'IT Support')[0];
      return {instruction: 'IT Support emailed you which time zone to use. Set it in Settings.', goal: {tz: tz},
              gui: [open('mail'), click('mail-row-' + m.id), open('settings'), choose('set-timezone', tz)],
              tool: [tool('mail_search', {query: 'IT Support'}), tool('settings_set', {key: 'timezone', value: tz})],
              questions: askSetting([], 'timezone', tz)};
    },
    check: function (S, g) { return S.settings.timezone === g.tz; }
  },
  files_report_to_sheet: {
    apps: ['files', 'sheet'], tool_beneficial: true,
    gen: function (r, S) {
      seedFiles(r, S);
      var last = seedSheet(r, S, 4), dir = S.files.folders[0], qty = String(r.int(61, 99)), row = r.int(2, last);
      var item = S.sheet.cells['A' + row];
      S.files.files.push({path: dir + '/stock.txt', content: item + ' stock: ' + qty});
      return {instruction: 'The file ' + dir + '/stock.txt has the new stock count for ' + item + '. Put that number into its Qty cell in the sheet.',
              goal: {ref: 'B' + row, qty: qty},
              gui: [open('files'), click('files-folder-' + dir), click('files-open-' + dir + '/stock.txt'), open('sheet'), type('cell-B' + row, qty)],
              tool: [tool('files_read', {path: dir + '/stock.txt'}), tool('sheet_set_cell', {cell: 'B' + row, value: qty})],
              questions: askCell([], 'B' + row, qty)};
    },
    check: function (S, g) { return same(S.sheet.cells[g.ref], g.qty); }
  }
};

function cap2(s) { return s.charAt(0).toUpperCase() + s.slice(1); }
