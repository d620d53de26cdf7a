CREATE TABLE t (id INTEGER, txt TEXT);
INSERT INTO t VALUES (1, 'good row one');
INSERT INTO t VALUES (2, 'bad row' 'missing comma');
INSERT INTO t VALUES (3, 'good row three'), (4, 'too', 'many values');
INSERT INTO t VALUES (5, 'never closed
